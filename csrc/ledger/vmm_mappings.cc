// The mapping table: an ordered map of non-overlapping ranges, each with an
// optional cached exported fd.
#include "ledger/vmm_mappings.h"

#include <fcntl.h>

#include <algorithm>
#include <iterator>
#include <mutex>

namespace vmmipc::ledger {
namespace {

ScopedFd DupCloexec(int fd) { return ScopedFd(::fcntl(fd, F_DUPFD_CLOEXEC, 0)); }

}  // namespace

void VmmMappings::TakeLocked(uint64_t base, uint64_t size, TakenMappings* taken) {
  auto it = records_.lower_bound(base);
  if (it != records_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.mapping.base + prev->second.mapping.size > base) it = prev;
  }
  while (it != records_.end() && it->second.mapping.base < base + size) {
    taken->records.push_back(it->second.mapping);
    taken->holders.push_back(std::move(it->second.holders));
    taken->unfollowed.push_back(std::move(it->second.unfollowed));
    if (it->second.fd.valid()) {
      --cached_fds_;
      taken->fds.push_back(std::move(it->second.fd));
    }
    it = records_.erase(it);
  }
}

uint32_t VmmMappings::Add(VmmMapping mapping) {
  TakenMappings stale;  // closed after the lock is released
  std::unique_lock lock(mutex_);
  TakeLocked(mapping.base, mapping.size, &stale);
  if (++next_generation_ == 0) next_generation_ = 0x80000000u;  // 0 never names memory
  mapping.generation = next_generation_;
  records_[mapping.base].mapping = mapping;
  return mapping.generation;
}

TakenMappings VmmMappings::Take(uint64_t base, uint64_t size) {
  TakenMappings taken;
  std::unique_lock lock(mutex_);
  TakeLocked(base, size, &taken);
  return taken;
}

void VmmMappings::Restore(const std::vector<VmmMapping>& records) {
  std::unique_lock lock(mutex_);
  for (const VmmMapping& mapping : records) {
    // A record added meanwhile at the same place is newer: keep it.
    if (records_.count(mapping.base) == 0) records_[mapping.base].mapping = mapping;
  }
}

std::optional<VmmMapping> VmmMappings::Find(uint64_t address) const {
  std::shared_lock lock(mutex_);
  auto it = records_.upper_bound(address);
  if (it == records_.begin()) return std::nullopt;
  --it;
  if (address - it->second.mapping.base >= it->second.mapping.size) return std::nullopt;
  VmmMapping found = it->second.mapping;
  found.fd_cached = it->second.fd.valid();
  return found;
}

std::vector<VmmMapping> VmmMappings::Run(uint64_t base, uint64_t end, size_t max_chunks) const {
  std::vector<VmmMapping> run;
  std::shared_lock lock(mutex_);
  for (auto it = records_.find(base); it != records_.end() && run.size() < max_chunks; ++it) {
    const VmmMapping& m = it->second.mapping;
    if (m.base >= end || (!run.empty() && m.base != run.back().base + run.back().size)) break;
    run.push_back(m);
  }
  return run;
}

bool VmmMappings::StillMapped(const std::vector<VmmMapping>& run, uint32_t follower,
                              uint32_t unfollowed_pid) {
  std::unique_lock lock(mutex_);
  for (const VmmMapping& m : run) {
    auto it = records_.find(m.base);
    if (it == records_.end() || it->second.mapping.generation != m.generation ||
        it->second.mapping.size != m.size)
      return false;
  }
  if (follower != 0)
    for (const VmmMapping& m : run) {
      std::vector<uint32_t>& holders = records_.find(m.base)->second.holders;
      if (std::find(holders.begin(), holders.end(), follower) == holders.end())
        holders.push_back(follower);
    }
  if (unfollowed_pid != 0)
    for (const VmmMapping& m : run) {
      std::vector<uint32_t>& pids = records_.find(m.base)->second.unfollowed;
      if (pids.size() < kMaxUnfollowedPerChunk &&
          std::find(pids.begin(), pids.end(), unfollowed_pid) == pids.end())
        pids.push_back(unfollowed_pid);
    }
  return true;
}

void VmmMappings::AddHolder(uint64_t base, uint32_t generation, uint32_t follower) {
  std::unique_lock lock(mutex_);
  auto it = records_.find(base);
  if (it == records_.end() || it->second.mapping.generation != generation) return;
  std::vector<uint32_t>& holders = it->second.holders;
  if (std::find(holders.begin(), holders.end(), follower) == holders.end())
    holders.push_back(follower);
}

void VmmMappings::NotePaused(PausedChunk chunk) {
  std::unique_lock lock(mutex_);
  if (paused_.count(chunk.base) == 0) paused_order_.push_back(chunk.base);
  paused_[chunk.base] = std::move(chunk);
  // The order list may hold bases already taken: the bound counts live entries.
  while (paused_.size() > kMaxPaused && !paused_order_.empty()) {
    paused_.erase(paused_order_.front());
    paused_order_.erase(paused_order_.begin());
  }
  if (paused_order_.size() > 2 * kMaxPaused) {
    std::erase_if(paused_order_, [&](uint64_t base) { return paused_.count(base) == 0; });
  }
}

std::optional<PausedChunk> VmmMappings::TakePaused(uint64_t base) {
  std::unique_lock lock(mutex_);
  auto it = paused_.find(base);
  if (it == paused_.end()) return std::nullopt;
  PausedChunk chunk = std::move(it->second);
  paused_.erase(it);
  return chunk;
}

size_t VmmMappings::size() const {
  std::shared_lock lock(mutex_);
  return records_.size();
}

void VmmMappings::SetFdCacheLimit(size_t limit) {
  std::unique_lock lock(mutex_);
  fd_limit_ = limit == 0 ? 1 : limit;
}

ScopedFd VmmMappings::DupCachedFd(uint64_t base, uint32_t generation) {
  // Exclusive: the fd cannot be taken out and closed while it is duplicated,
  // and last_use is written.
  std::unique_lock lock(mutex_);
  auto it = records_.find(base);
  if (it == records_.end() || it->second.mapping.generation != generation || !it->second.fd.valid())
    return ScopedFd();
  it->second.last_use = ++clock_;
  return DupCloexec(it->second.fd.get());
}

ScopedFd VmmMappings::CacheFd(uint64_t base, uint32_t generation, ScopedFd fd,
                              std::vector<ScopedFd>* evicted) {
  std::unique_lock lock(mutex_);
  auto it = records_.find(base);
  if (it == records_.end() || it->second.mapping.generation != generation || it->second.fd.valid())
    return fd;
  ScopedFd copy = DupCloexec(fd.get());
  if (!copy.valid()) return fd;  // out of fds: send the one we have, cache nothing
  while (cached_fds_ >= fd_limit_) {
    // Evict the least recently used; the newcomer keeps the process's export
    // state alive, so the cache never drops to zero through eviction.
    auto victim = records_.end();
    for (auto r = records_.begin(); r != records_.end(); ++r)
      if (r->second.fd.valid() &&
          (victim == records_.end() || r->second.last_use < victim->second.last_use))
        victim = r;
    if (victim == records_.end()) break;
    evicted->push_back(std::move(victim->second.fd));
    --cached_fds_;
  }
  it->second.fd = std::move(fd);
  it->second.last_use = ++clock_;
  ++cached_fds_;
  return copy;
}

bool VmmMappings::CloseCachedFdsInForkedChild() {
  if (!mutex_.ChildAfterFork()) return false;
  std::unique_lock lock(mutex_);
  for (auto& [base, record] : records_) record.fd.Reset();
  cached_fds_ = 0;
  return true;
}

size_t VmmMappings::cached_fd_count() const { return cached_fds_.load(std::memory_order_relaxed); }

}  // namespace vmmipc::ledger
