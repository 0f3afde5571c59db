// The open's decode step: the handle, the call's flags, not a handle of our
// own, a current context. Handles that are not VMM2 go to the real driver.
#include "core/identity.h"
#include "core/import/interior_handles.h"
#include "core/import/opening.h"
#include "core/real.h"
#include "core/stats.h"

namespace vmmipc::core {
namespace {

CUresult ForwardOpen(CUdeviceptr* pointer, const CUipcMemHandle& handle, unsigned int flags,
                     bool v2) {
  return v2 ? VMMIPC_REAL(IpcOpenMemHandle, pointer, handle, flags)
            : VMMIPC_REAL(IpcOpenMemHandleV1, pointer, handle, flags);
}

}  // namespace

log::LineLimit& OpenLines() {
  static log::LineLimit lines;
  return lines;
}

std::optional<CUresult> DecodeOpen(CUdeviceptr* pointer, const CUipcMemHandle& raw,
                                   unsigned int flags, bool v2, Opening* open) {
  ledger::Vmm2Handle& h = open->handle;
  const auto* bytes = reinterpret_cast<const unsigned char*>(raw.reserved);
  switch (ledger::DecodeHandle(bytes, &h)) {
    case ledger::DecodeStatus::kOk:
      break;
    case ledger::DecodeStatus::kNotVmm2:
      return ForwardOpen(pointer, raw, flags, v2);
    case ledger::DecodeStatus::kBadChecksum:
      // Four bytes of a foreign handle can spell "VMM2" by chance: let the
      // driver judge it (it refuses garbage safely, measured).
      VMMIPC_LOG_DEBUG("handle has the VMM2 magic but a bad checksum; passing it to the driver");
      return ForwardOpen(pointer, raw, flags, v2);
    case ledger::DecodeStatus::kUnknownVersion:
      stats::Count(stats::Counter::kOpenFailedBadHandle);
      OpenWarning(log::Level::kError,
                  "cuIpcOpenMemHandle: VMM2 handle version {} is not supported by this "
                  "vmmipc (knows version {}); use the same vmmipc in every process",
                  ledger::HandleVersion(bytes), ledger::kHandleVersion);
      return CUDA_ERROR_NOT_SUPPORTED;
    case ledger::DecodeStatus::kMalformed:
      stats::Count(stats::Counter::kOpenFailedBadHandle);
      OpenWarning(log::Level::kWarn,
                  "cuIpcOpenMemHandle: malformed VMM2 handle (fields contradict)");
      return CUDA_ERROR_INVALID_VALUE;
  }
  if (pointer == nullptr || flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
    stats::Count(stats::Counter::kOpenFailedInvalid);
  if (pointer == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) {
    OpenWarning(log::Level::kWarn,
                "cuIpcOpenMemHandle: flags 0x{:x} refused; the driver only takes "
                "CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS",
                flags);
    return CUDA_ERROR_INVALID_VALUE;
  }
  const Identity& self = OwnIdentity();
  if (h.pid == self.pid && h.instance == self.instance) {
    OpenWarning(log::Level::kWarn, "cuIpcOpenMemHandle: the handle was exported by this process");
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  if (VMMIPC_REAL(CtxGetDevice, &open->device) != CUDA_SUCCESS) {
    OpenWarning(log::Level::kWarn, "cuIpcOpenMemHandle: no current CUDA context");
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  open->key = {{h.pid, h.instance}, h.address, h.generation, h.region_base, h.rank_slot};
  open->opened_address = OpenedExporterAddress(h);
  return std::nullopt;
}

}  // namespace vmmipc::core
