// The mapping table's part in prefetch (docs/protocol.md, "Prefetch"): which
// chunks handles were handed out for, and the runs one reply may send an
// importer that did not present their handles.
#include <fcntl.h>

#include <algorithm>
#include <mutex>

#include "ledger/vmm_mappings.h"

namespace vmmipc::ledger {

void VmmMappings::MarkHandedOut(uint64_t base, uint32_t generation) {
  std::unique_lock lock(mutex_);
  auto it = records_.find(base);
  if (it == records_.end() || it->second.mapping.generation != generation) return;
  it->second.handed_out = true;
  handed_out_.insert(base);
}

// A run an open of a handle at `start` would be granted, and that cannot grow
// later: contiguous chunks of one region up to exactly its end (a run that
// stops short could be extended by a later cuMemMap, which no event tells;
// such runs are fetched when opened).
std::vector<std::map<uint64_t, VmmMappings::Record>::iterator> VmmMappings::PrefetchableRun(
    std::map<uint64_t, Record>::iterator start, const PrefetchAsk& ask) {
  std::vector<std::map<uint64_t, Record>::iterator> run;
  const VmmMapping& first = start->second.mapping;
  if (first.device != ask.device) return {};
  for (auto it = start; it != records_.end(); ++it) {
    const VmmMapping& m = it->second.mapping;
    if (!run.empty() && m.base != run.back()->second.mapping.base + run.back()->second.mapping.size)
      break;
    if (m.region_base != first.region_base || m.region_end != first.region_end) break;
    const std::vector<uint32_t>& holders = it->second.holders;
    if (m.offset != 0 || !m.posix_fd_exportable || !it->second.fd.valid() ||
        std::find(holders.begin(), holders.end(), ask.follower) != holders.end() ||
        (m.base < ask.skip_end && m.base + m.size > ask.skip_base))
      return {};
    run.push_back(it);
    if (m.base + m.size == m.region_end) return run;  // complete
  }
  return {};
}

std::vector<PrefetchRun> VmmMappings::TakePrefetch(const PrefetchAsk& ask) {
  std::vector<PrefetchRun> runs;
  if (ask.follower == 0) return runs;
  size_t chunks = 0;
  uint64_t bytes = 0;
  size_t scanned = 0;
  std::unique_lock lock(mutex_);
  for (auto base = handed_out_.begin();
       base != handed_out_.end() && scanned < kMaxPrefetchScan && chunks < ask.max_chunks;
       ++scanned) {
    auto start = records_.find(*base);
    if (start == records_.end() || !start->second.handed_out) {
      base = handed_out_.erase(base);  // the record went without TakeLocked (cannot today)
      continue;
    }
    ++base;
    const auto run = PrefetchableRun(start, ask);
    uint64_t run_bytes = 0;
    for (const auto& it : run) run_bytes += it->second.mapping.size;
    if (run.empty() || chunks + run.size() > ask.max_chunks || bytes + run_bytes > ask.max_bytes)
      continue;
    PrefetchRun sent;
    for (const auto& it : run) {
      ScopedFd fd(::fcntl(it->second.fd.get(), F_DUPFD_CLOEXEC, 0));
      if (!fd.valid()) break;  // out of fds: not this run
      VmmMapping m = it->second.mapping;
      m.fd_cached = true;
      sent.chunks.push_back(m);
      sent.fds.push_back(std::move(fd));
    }
    if (sent.chunks.size() != run.size()) continue;  // its dups close here
    for (const auto& it : run) it->second.holders.push_back(ask.follower);
    chunks += run.size();
    bytes += run_bytes;
    runs.push_back(std::move(sent));
  }
  return runs;
}

}  // namespace vmmipc::ledger
