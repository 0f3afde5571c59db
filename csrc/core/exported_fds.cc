// The driver side of the exported-fd cache (state/vmm_mappings.h keeps the
// fds): an fd for a tracked chunk, a dup of the cached one, or exported once.
#include "core/exported_fds.h"

#include <sys/resource.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "common/elapsed.h"
#include "core/real.h"
#include "core/stats.h"
#include "driver/status.h"

namespace vmmipc::core {
namespace {

// A hint to the core that this thread is spinning (no syscall).
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Exports the allocation mapped at `base` as a POSIX fd.
CUresult ExportAt(uint64_t base, ScopedFd* fd) {
  CUmemGenericAllocationHandle handle = 0;
  VMMIPC_CU_CHECK(MemRetainAllocationHandle, &handle, reinterpret_cast<void*>(base));
  int raw = -1;
  const CUresult exported = VMMIPC_REAL(MemExportToShareableHandle, &raw, handle,
                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  (void)VMMIPC_REAL(MemRelease, handle);  // the retain's reference; the mapping keeps its own
  if (exported != CUDA_SUCCESS) return exported;
  stats::Count(stats::Counter::kFdsExported);
  fd->Reset(raw);
  return CUDA_SUCCESS;
}

// Takes an export stripe. The listener's poll thread meets the export ahead
// here when an open follows its get at once: the worker is exporting that very
// chunk. Sleeping on the mutex would add a wake-up (~15 us on the H200 hosts,
// the same as a socket's) to the export's ~35-40 us, so it first spins for
// about one export's time, then sleeps (the process's first export takes
// ~600 us: the driver's export set-up).
void LockForExport(std::unique_lock<std::mutex>& stripe) {
  constexpr auto kSpin = std::chrono::microseconds(100);
  if (stripe.try_lock()) return;
  const auto until = SteadyClock::now() + kSpin;
  do {
    for (int i = 0; i < 64; ++i) CpuRelax();
    if (stripe.try_lock()) return;
  } while (SteadyClock::now() < until);
  stripe.lock();
}

}  // namespace

// An fd for one tracked chunk: a dup of the cached export when there is one
// (no driver call), else a fresh export that is cached for the next grant.
CUresult FdForChunk(ProcessState& state, const state::VmmMapping& chunk, ScopedFd* fd) {
  *fd = state.exporter.mappings().DupCachedFd(chunk.base, chunk.generation);
  if (fd->valid()) {
    stats::Count(stats::Counter::kFdCacheGrants);
    return CUDA_SUCCESS;
  }
  // Two answers missing the same chunk at once (peers opening together, or
  // the export ahead) would export it twice: one export per chunk, the
  // second waits and takes a dup. Striped by chunk address; never held
  // across anything but this chunk's export.
  static std::mutex export_stripes[16];
  std::unique_lock<std::mutex> stripe(export_stripes[(chunk.base >> 21) % 16], std::defer_lock);
  LockForExport(stripe);
  *fd = state.exporter.mappings().DupCachedFd(chunk.base, chunk.generation);
  if (fd->valid()) {
    stats::Count(stats::Counter::kFdCacheGrants);
    return CUDA_SUCCESS;
  }
  ScopedFd exported;
  VMMIPC_RETURN_IF_ERROR(ExportAt(chunk.base, &exported));
  std::vector<ScopedFd> evicted;  // closed here, outside the table's lock
  *fd = state.exporter.mappings().CacheFd(chunk.base, chunk.generation, std::move(exported),
                                          &evicted);
  if (!evicted.empty()) stats::Count(stats::Counter::kFdCacheEvictions, evicted.size());
  return CUDA_SUCCESS;
}

// A quarter of RLIMIT_NOFILE at most: the host needs the rest.
size_t FdCacheLimit(int64_t configured) {
  rlimit limit{};
  size_t cap = static_cast<size_t>(configured);
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY)
    cap = std::min<size_t>(cap, std::max<rlim_t>(limit.rlim_cur / 4, 1));
  return std::max<size_t>(cap, 1);
}

// Runs on a listener worker. It has no context of its own: use the one the
// first export ran in, once per thread (export works without one, measured,
// but the range queries were not measured that way).
void UseExportContext(const ProcessState& state) {
  static thread_local bool context_set = false;
  if (!context_set && state.exporter.export_context() != nullptr) {
    context_set =
        VMMIPC_REAL(CtxSetCurrent, static_cast<CUcontext>(state.exporter.export_context())) ==
        CUDA_SUCCESS;
  }
}

}  // namespace vmmipc::core
