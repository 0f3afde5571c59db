// The import side's table operations, each under the import lock, and its
// zone reservation.
#include "core/import/import_side.h"

#include <algorithm>

namespace vmmipc::core {

std::optional<uint64_t> ImportSide::Reopen(const state::OpenKey& key) {
  return WithTable([&](state::ImportTable& table) { return table.Reopen(key); });
}

std::optional<uint64_t> ImportSide::ReopenOrEndOpen(const state::OpenKey& key, uint64_t in_flight,
                                                    std::vector<state::FollowEvent>* missed,
                                                    bool* overflowed) {
  return WithTable([&](state::ImportTable& table) -> std::optional<uint64_t> {
    *overflowed = false;
    if (in_flight != 0) *missed = in_flight_.End(in_flight, overflowed);
    return table.Reopen(key);
  });
}

ImportSide::ClaimResult ImportSide::ClaimRun(uint32_t slot, const state::ExporterId& exporter,
                                             uint64_t target, uint64_t pointer,
                                             const std::vector<state::FetchedChunk>& run,
                                             int32_t device, RunPlan* plan) {
  const uint64_t run_base = run.front().address;
  const uint64_t run_size = run.back().address + run.back().size - run_base;
  return WithTable([&](state::ImportTable& table) {
    ClaimResult result;
    if (slot != state::kNotInZone) {
      if (std::optional<state::ExporterId> owner = table.SlotOwner(slot);
          owner && *owner != exporter) {
        result.claim = Claim::kCollision;
        result.owner = *owner;
        result.repeat = !table.FirstCollision(slot, exporter);
        return result;
      }
      for (const state::FetchedChunk& chunk : run) {
        if (table.Probe(target + (chunk.address - run_base), chunk.size, exporter, chunk.address,
                        chunk.generation) == state::ChunkProbe::kConflict) {
          result.claim = Claim::kOccupied;
          return result;
        }
      }
    }
    // Another handle's open returned this pointer for another run (only
    // possible after a followed resume changed what lies there).
    if (table.UseOf(pointer, target, run_size) == state::PointerUse::kOtherRun) {
      result.claim = Claim::kOtherRun;
      return result;
    }
    *plan = {};
    for (const state::FetchedChunk& chunk : run) {
      const state::MappedChunk mapped{target + (chunk.address - run_base),
                                      chunk.size,
                                      exporter,
                                      chunk.address,
                                      chunk.generation,
                                      0,
                                      device,
                                      chunk.paused};
      plan->targets.push_back(mapped.target);
      if (table.Probe(mapped.target, mapped.size, exporter, mapped.exporter_address,
                      mapped.generation) == state::ChunkProbe::kSame)
        continue;  // an earlier open mapped it already: shared, reference counted
      plan->mapped_now.push_back(mapped);
      plan->fd_to_map.push_back(chunk.paused ? -1 : chunk.fd);
    }
    return result;
  });
}

bool ImportSide::KeyToClose(uint64_t pointer, std::optional<state::OpenKey>* key) {
  return WithTable([&](state::ImportTable& table) {
    if (table.open_count() == 0) return false;
    *key = table.KeyOf(pointer);
    return true;
  });
}

void ImportSide::AddOpen(const std::vector<state::MappedChunk>& mapped, state::OpenRecord record) {
  WithTable([&](state::ImportTable& table) {
    for (const state::MappedChunk& chunk : mapped) table.AddChunk(chunk);
    table.AddOpen(std::move(record));
  });
}

state::CloseResult ImportSide::Close(uint64_t pointer) {
  return WithTable([&](state::ImportTable& table) { return table.Close(pointer); });
}

bool ImportSide::RunAt(uint64_t address, uint64_t* base, uint64_t* size) {
  return WithTable([&](state::ImportTable& table) {
    if (table.open_count() == 0) return false;
    const state::OpenRecord* record = table.FindByAddress(address);
    if (record == nullptr) return false;
    *base = record->run_base;
    *size = record->run_size;
    return true;
  });
}

std::vector<state::MappedChunk> ImportSide::Pause(const state::ExporterId& exporter, uint64_t base,
                                                  uint32_t generation) {
  return WithTable(
      [&](state::ImportTable& table) { return table.Pause(exporter, base, generation); });
}

std::vector<state::MappedChunk> ImportSide::PausedAt(const state::ExporterId& exporter,
                                                     uint64_t base) {
  return WithTable([&](state::ImportTable& table) { return table.PausedAt(exporter, base); });
}

std::vector<state::MappedChunk> ImportSide::PauseAll(const state::ExporterId& exporter) {
  return WithTable([&](state::ImportTable& table) { return table.PauseAll(exporter); });
}

void ImportSide::Resume(uint64_t target, uint32_t generation) {
  WithTable([&](state::ImportTable& table) { table.Resume(target, generation); });
}

std::vector<size_t> ImportSide::PlacementIndexesOf(const state::ExporterId& exporter) {
  std::vector<size_t> indexes = WithTable([&](state::ImportTable& table) {
    std::vector<size_t> found = in_flight_.LockIndexes(exporter);
    for (uint32_t slot : table.RankSlotsOf(exporter))
      found.push_back(PlacementIndex(slot, exporter.pid));
    return found;
  });
  std::sort(indexes.begin(), indexes.end());
  indexes.erase(std::unique(indexes.begin(), indexes.end()), indexes.end());
  return indexes;
}

uint64_t ImportSide::BeginOpen(const state::ExporterId& exporter, size_t placement_index) {
  return WithTable(
      [&](state::ImportTable&) { return in_flight_.Begin(exporter, placement_index); });
}

std::vector<state::FollowEvent> ImportSide::EndOpen(uint64_t id, bool* overflowed) {
  return WithTable([&](state::ImportTable&) { return in_flight_.End(id, overflowed); });
}

bool ImportSide::LogForOpensInFlight(const state::ExporterId& exporter,
                                     const state::FollowEvent& event) {
  return WithTable([&](state::ImportTable&) { return in_flight_.Log(exporter, event); });
}

std::optional<state::ZoneLayout> ImportSide::Zone(ReserveZone reserve) {
  std::lock_guard<std::mutex> lock(zone_mutex_);
  if (zone_state_ == ZoneState::kUntried) {
    zone_state_ = ZoneState::kUnavailable;
    if (std::optional<state::ZoneLayout> reserved = reserve()) {
      zone_ = *reserved;
      zone_state_ = ZoneState::kReserved;
    }
  }
  if (zone_state_ != ZoneState::kReserved) return std::nullopt;
  return zone_;
}

std::optional<state::ZoneLayout> ImportSide::ReservedZone() {
  std::lock_guard<std::mutex> lock(zone_mutex_);
  if (zone_state_ != ZoneState::kReserved) return std::nullopt;
  return zone_;
}

}  // namespace vmmipc::core
