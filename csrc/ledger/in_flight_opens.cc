// The in-flight opens' event logs, and how a log changes a fetched run.
#include "ledger/in_flight_opens.h"

#include <algorithm>

namespace vmmipc::ledger {

uint64_t InFlightOpens::Begin(const ExporterId& exporter, size_t lock_index) {
  const uint64_t id = next_id_++;
  opens_[id] = Open{exporter, lock_index, {}, false};
  return id;
}

std::vector<FollowEvent> InFlightOpens::TakeLog(uint64_t id, bool* overflowed) {
  auto it = opens_.find(id);
  *overflowed = false;
  if (it == opens_.end() || it->second.placing) return {};
  it->second.placing = true;
  *overflowed = it->second.overflowed;
  return std::move(it->second.events);
}

std::vector<FollowEvent> InFlightOpens::End(uint64_t id, bool* overflowed) {
  auto it = opens_.find(id);
  if (it == opens_.end()) {
    *overflowed = false;
    return {};
  }
  std::vector<FollowEvent> events = std::move(it->second.events);
  *overflowed = it->second.overflowed;
  opens_.erase(it);
  return events;
}

bool InFlightOpens::Log(const ExporterId& exporter, const FollowEvent& event) {
  bool any = false;
  for (auto& [id, open] : opens_) {
    if (open.exporter != exporter || open.placing) continue;
    any = true;
    if (open.events.size() >= kMaxEvents) {
      open.overflowed = true;
      continue;
    }
    open.events.push_back(event);
  }
  return any;
}

std::vector<size_t> InFlightOpens::LockIndexes(const ExporterId& exporter) const {
  std::vector<size_t> indexes;
  for (const auto& [id, open] : opens_)
    if (open.exporter == exporter) indexes.push_back(open.lock_index);
  return indexes;
}

void ApplyFollowEvents(const std::vector<FollowEvent>& events, std::vector<FetchedChunk>* run) {
  for (const FollowEvent& event : events) {
    if (event.unfollowed) continue;
    for (FetchedChunk& chunk : *run) {
      if (chunk.address != event.base) continue;
      if (!event.resume) {
        if (!chunk.paused && chunk.generation == event.generation) {
          chunk.paused = true;
          chunk.refused = false;
          chunk.fd = -1;
          chunk.resumed_fd.reset();
        }
      } else if (chunk.paused) {
        chunk.generation = event.generation;
        if (event.size != chunk.size || !event.fd || !event.fd->valid()) {
          chunk.refused = true;  // stays paused: nothing of another size is mapped
          continue;
        }
        chunk.paused = false;
        chunk.refused = false;
        chunk.resumed_fd = event.fd;
        chunk.fd = event.fd->get();
      }
    }
  }
}

bool AnyUnfollowed(const std::vector<FollowEvent>& events) {
  return std::any_of(events.begin(), events.end(),
                     [](const FollowEvent& event) { return event.unfollowed; });
}

}  // namespace vmmipc::ledger
