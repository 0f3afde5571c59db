// The exporter's get: cuIpcGetMemHandle on VMM memory (metadata only, no fd
// until a peer asks; core/export/serve_request.h answers the peer's request,
// core/export/export_listener.h starts the listener on the first get).
#include <cstdint>

#include "common/log.h"
#include "config/params.h"
#include "core/ahead.h"
#include "core/export/announce.h"
#include "core/export/export_ahead.h"
#include "core/export/export_listener.h"
#include "core/export/rank_slot.h"
#include "core/export/vmm_memory.h"
#include "core/handle_fields.h"
#include "core/hooks.h"
#include "core/identity.h"
#include "core/real.h"
#include "core/stats.h"
#include "ledger/handle_codec.h"
#include "transport/wire.h"

namespace vmmipc::core {

CUresult IpcGetMemHandle(CUipcMemHandle* out, CUdeviceptr address) {
  if (out == nullptr) return VMMIPC_REAL(IpcGetMemHandle, out, address);
  // Memory mapped through vmmipc's cuMemMap hook is described from the
  // mapping table, with no driver call. Anything else asks the real driver
  // first: legacy memory keeps its legacy handle, untouched.
  ChunkInfo chunk;
  if (!DescribeTracked(address, &chunk)) {
    const CUresult legacy = VMMIPC_REAL(IpcGetMemHandle, out, address);
    if (legacy != CUDA_ERROR_INVALID_VALUE) return legacy;
    if (DescribeChunk(address, &chunk) != CUDA_SUCCESS) return legacy;  // not VMM memory either
  }
  if (!chunk.posix_fd_exportable) {
    stats::Count(stats::Counter::kExportRefusedNoPosixFd);
    VMMIPC_LOG_WARN(
        "cuIpcGetMemHandle(0x{:x}): VMM memory created without "
        "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR cannot be shared (created before "
        "vmmipc was loaded, or VMMIPC_FORCE_POSIX_FD=0)",
        address);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (chunk.offset != 0) {
    stats::Count(stats::Counter::kExportRefusedOther);
    VMMIPC_LOG_WARN(
        "cuIpcGetMemHandle(0x{:x}): the mapping starts at offset 0x{:x} of its "
        "allocation; vmmipc shares mappings of whole allocations from offset 0 only",
        address, chunk.offset);
    return CUDA_ERROR_INVALID_VALUE;
  }
  const uint64_t region_base = chunk.region_base;

  Identity& self = OwnIdentity();
  ExportSide& exporter = Exporter();
  if (!exporter.EnsureListener(
          [&](void** context) { return StartListener(self, exporter, context); })) {
    stats::Count(stats::Counter::kExportRefusedNoListener);
    return CUDA_ERROR_OPERATING_SYSTEM;
  }
  ledger::Vmm2Handle handle;
  handle.rank_slot = SlotForExport(self, chunk.device);
  handle.pid = self.pid;
  handle.generation = chunk.generation;
  handle.instance = self.instance;
  handle.address = address;
  handle.chunk_size = chunk.size;
  handle.chunk_base = chunk.base;
  handle.region_base = region_base;
  // The handle grants what it names, nothing else (docs/security.md): the
  // listener serves a request only under this MAC of exactly these fields.
  handle.capability = transport::wire::Capability(self.secret, FieldsOf(handle));
  ledger::EncodeHandle(handle, reinterpret_cast<unsigned char*>(out->reserved));
  stats::Count(stats::Counter::kHandlesExported);
  if (!chunk.export_cached && chunk.posix_fd_exportable) {
    if (config::Get().export_in_get)
      ExportInGet(chunk.base);
    else
      QueueExportAhead(exporter, chunk.base);
  }
  // Ahead: importers that follow this process may map it now, while the
  // application still passes the handle on.
  if (AheadOn())
    AnnounceHandle(exporter, handle, reinterpret_cast<const unsigned char*>(out->reserved));
  VMMIPC_LOG_DEBUG("exported 0x{:x} (chunk 0x{:x}+0x{:x}, region 0x{:x}, generation {})", address,
                   chunk.base, chunk.size, region_base, chunk.generation);
  return CUDA_SUCCESS;
}

}  // namespace vmmipc::core
