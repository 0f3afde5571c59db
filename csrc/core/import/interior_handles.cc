// VMMIPC_INTERIOR_HANDLES: address, allocation, or auto (allocation where
// UCX's CUDA transport is loaded). Why auto looks at UCX: its cuda_ipc takes
// a handle at the buffer it registers, wherever that lies in the allocation,
// and adds `buffer - cuMemGetAddressRange(buffer).base` to what the open
// returns, as the driver's rule wants; with the exact address that offset
// counts twice (a NIXL READ of a tensor 12 MiB into a 20 MiB chunk went
// 12 MiB off, measured). Callers that send offsets from a buffer carved out
// of a larger chunk want the exact address; both kinds in one process are
// not known.
#include "core/import/interior_handles.h"

#include <atomic>
#include <string>

#include "common/loaded_library.h"
#include "common/log.h"
#include "config/params.h"

namespace vmmipc::core {
namespace {

// UCX's CUDA transports (cuda_ipc, cuda_copy) live in libuct_cuda.so, loaded
// by UCX when it starts; NIXL's UCX backend bundles it under that name too.
constinit LoadedLibraryProbe ucx_cuda("libuct_cuda");
std::atomic<bool> said_auto{false};

}  // namespace

uint64_t OpenedExporterAddress(const ledger::Vmm2Handle& handle) {
  if (handle.address == handle.chunk_base) return handle.address;
  const std::string& rule = config::Get().interior_handles;
  if (rule == "address") return handle.address;
  if (rule == "allocation") return handle.chunk_base;
  if (!ucx_cuda.Loaded()) return handle.address;
  if (!said_auto.exchange(true, std::memory_order_relaxed))
    VMMIPC_LOG_INFO(
        "cuIpcOpenMemHandle: UCX's CUDA transport (libuct_cuda) is loaded here, so a handle "
        "taken inside a chunk opens at the start of that chunk, as the driver's legacy handles "
        "do (UCX adds the offset itself); VMMIPC_INTERIOR_HANDLES=address keeps the exact "
        "address");
  return handle.chunk_base;
}

}  // namespace vmmipc::core
