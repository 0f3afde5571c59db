// The import side's prefetched fds (core/prefetch.h): kept after the fetch
// that brought them, taken by an open of one of their handles, dropped on a
// follow event of their exporter and in a forked child. The order of an
// open keeping and an event dropping is said in import_side.h.
#include <algorithm>
#include <mutex>

#include "core/import/import_side.h"

namespace vmmipc::core {

void ImportSide::KeepPrefetchedLocked(const ledger::ExporterId& exporter,
                                      const std::vector<ledger::FollowEvent>& missed,
                                      bool overflowed, PrefetchKeep* keep) {
  // Without a watch connection nothing would tell this process when the
  // exporter unmaps them: not kept. Its loss drops them too (KeepWatch, and
  // the watch client's end of a connection), under this lock.
  const bool drop_all =
      overflowed || ledger::AnyUnfollowed(missed) || !follow_.Watches(keep->watch_tag);
  std::lock_guard<ForkMutex> lock(prefetch_mutex_);
  for (std::vector<ledger::PrefetchedChunk>& run : keep->runs) {
    // An event since the fetch began about a chunk of the run: the exporter
    // paused or resumed it, and what came is stale. Fetched when opened.
    const bool touched = std::any_of(run.begin(), run.end(), [&](const auto& chunk) {
      return std::any_of(missed.begin(), missed.end(),
                         [&](const ledger::FollowEvent& e) { return e.base == chunk.address; });
    });
    const size_t count = run.size();
    if (!drop_all && !touched && prefetched_.Keep(exporter, &run)) {
      keep->kept += count;
      continue;
    }
    for (ledger::PrefetchedChunk& chunk : run) keep->dropped.push_back(std::move(chunk.fd));
    run.clear();
  }
}

std::vector<ledger::PrefetchedChunk> ImportSide::TakePrefetched(const ledger::ExporterId& exporter,
                                                                uint64_t base, uint64_t size,
                                                                uint32_t generation,
                                                                uint64_t region_base) {
  return WithTable([&](ledger::ImportTable&) {
    std::lock_guard<ForkMutex> lock(prefetch_mutex_);
    return prefetched_.TakeRun(exporter, base, size, generation, region_base);
  });
}

size_t ImportSide::DropPrefetched(const ledger::ExporterId& exporter, uint64_t base, bool all,
                                  std::vector<ledger::PrefetchedChunk>* dropped) {
  return WithTable([&](ledger::ImportTable&) -> size_t {
    std::lock_guard<ForkMutex> lock(prefetch_mutex_);
    if (all) return prefetched_.DropExporter(exporter, dropped);
    return prefetched_.Drop(exporter, base, dropped) ? 1 : 0;
  });
}

size_t ImportSide::prefetched_fd_count() {
  return WithTable([&](ledger::ImportTable&) {
    std::lock_guard<ForkMutex> lock(prefetch_mutex_);
    return prefetched_.fd_count();
  });
}

void ImportSide::NoPrefetchFrom(const ledger::ExporterId& exporter) {
  WithTable([&](ledger::ImportTable&) { no_prefetch_.insert(exporter); });
}

bool ImportSide::PrefetchRefusedBy(const ledger::ExporterId& exporter) {
  return WithTable([&](ledger::ImportTable&) { return no_prefetch_.count(exporter) != 0; });
}

void ImportSide::ClosePrefetchedAfterFork() noexcept {
  // False only when the thread that forked held the lock itself: leave the copies open.
  if (!prefetch_mutex_.ChildAfterFork()) return;
  // Plain closes: the parent's stay open. Imported handles are the parent's
  // driver's, which a forked child cannot call: forgotten.
  std::vector<ledger::PrefetchedChunk> copies;
  try {
    prefetched_.DropAll(&copies);
  } catch (...) {
  }
}

}  // namespace vmmipc::core
