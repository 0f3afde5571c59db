// The import side's table operations, each under the import lock, and its
// zone reservation.
#include "core/import/import_side.h"

#include <algorithm>

namespace vmmipc::core {

std::optional<uint64_t> ImportSide::Reopen(const ledger::OpenKey& key, ledger::Reopener* who) {
  return WithTable([&](ledger::ImportTable& table) { return table.Reopen(key, who); });
}

std::optional<uint64_t> ImportSide::ReopenOrEndOpen(const ledger::OpenKey& key,
                                                    ledger::Reopener* who, uint64_t in_flight,
                                                    std::vector<ledger::FollowEvent>* missed,
                                                    bool* overflowed) {
  return WithTable([&](ledger::ImportTable& table) -> std::optional<uint64_t> {
    *overflowed = false;
    if (in_flight != 0) *missed = in_flight_.TakeLog(in_flight, overflowed);
    return table.Reopen(key, who);
  });
}

ImportSide::ClaimResult ImportSide::ClaimRun(uint32_t slot, const ledger::ExporterId& exporter,
                                             uint64_t target, uint64_t pointer,
                                             const std::vector<ledger::FetchedChunk>& run,
                                             int32_t device, RunPlan* plan) {
  const uint64_t run_base = run.front().address;
  const uint64_t run_size = run.back().address + run.back().size - run_base;
  return WithTable([&](ledger::ImportTable& table) {
    ClaimResult result;
    if (slot != ledger::kNotInZone) {
      if (std::optional<ledger::ExporterId> owner = table.SlotOwner(slot);
          owner && *owner != exporter) {
        result.claim = Claim::kCollision;
        result.owner = *owner;
        result.repeat = !table.FirstCollision(slot, exporter);
        return result;
      }
      for (const ledger::FetchedChunk& chunk : run) {
        if (table.Probe(target + (chunk.address - run_base), chunk.size, exporter, chunk.address,
                        chunk.generation) == ledger::ChunkProbe::kConflict) {
          result.claim = Claim::kOccupied;
          return result;
        }
      }
    }
    // Another handle's open returned this pointer for another run (only
    // possible after a followed resume changed what lies there).
    if (table.UseOf(pointer, target, run_size) == ledger::PointerUse::kOtherRun) {
      result.claim = Claim::kOtherRun;
      return result;
    }
    *plan = {};
    for (const ledger::FetchedChunk& chunk : run) {
      const ledger::MappedChunk mapped{target + (chunk.address - run_base),
                                       chunk.size,
                                       exporter,
                                       chunk.address,
                                       chunk.generation,
                                       0,
                                       device,
                                       chunk.paused};
      plan->targets.push_back(mapped.target);
      if (table.Probe(mapped.target, mapped.size, exporter, mapped.exporter_address,
                      mapped.generation) == ledger::ChunkProbe::kSame)
        continue;  // an earlier open mapped it already: shared, reference counted
      plan->mapped_now.push_back(mapped);
      plan->fd_to_map.push_back(chunk.paused ? -1 : chunk.fd);
    }
    return result;
  });
}

bool ImportSide::KeyToClose(uint64_t pointer, std::optional<ledger::OpenKey>* key) {
  return WithTable([&](ledger::ImportTable& table) {
    if (table.open_count() == 0) return false;
    *key = table.KeyOf(pointer);
    return true;
  });
}

bool ImportSide::AddOpen(const std::vector<ledger::MappedChunk>& mapped,
                         ledger::OpenRecord record) {
  return WithTable([&](ledger::ImportTable& table) {
    for (const ledger::MappedChunk& chunk : mapped) table.AddChunk(chunk);
    return table.AddOpen(std::move(record));
  });
}

ledger::CloseResult ImportSide::Close(uint64_t pointer) {
  return WithTable([&](ledger::ImportTable& table) { return table.Close(pointer); });
}

ledger::CloseResult ImportSide::DropAhead(const ledger::ExporterId& exporter, uint64_t base,
                                          bool all) {
  return WithTable(
      [&](ledger::ImportTable& table) { return table.DropAhead(exporter, base, all); });
}

ledger::CloseResult ImportSide::DropAheadKey(const ledger::OpenKey& key) {
  return WithTable([&](ledger::ImportTable& table) { return table.DropAheadKey(key); });
}

ledger::AheadUse ImportSide::AheadOf(const ledger::ExporterId& exporter) {
  return WithTable([&](ledger::ImportTable& table) { return table.AheadOf(exporter); });
}

std::optional<uint32_t> ImportSide::FirstSlotOf(const ledger::ExporterId& exporter) {
  return WithTable([&](ledger::ImportTable& table) { return table.FirstSlotOf(exporter); });
}

bool ImportSide::RunAt(uint64_t address, uint64_t* base, uint64_t* size) {
  return WithTable([&](ledger::ImportTable& table) {
    if (table.open_count() == 0) return false;
    const ledger::OpenRecord* record = table.FindByAddress(address);
    if (record == nullptr) return false;
    *base = record->run_base;
    *size = record->run_size;
    return true;
  });
}

std::vector<ledger::MappedChunk> ImportSide::Pause(const ledger::ExporterId& exporter,
                                                   uint64_t base, uint32_t generation) {
  return WithTable(
      [&](ledger::ImportTable& table) { return table.Pause(exporter, base, generation); });
}

std::vector<ledger::MappedChunk> ImportSide::PausedAt(const ledger::ExporterId& exporter,
                                                      uint64_t base) {
  return WithTable([&](ledger::ImportTable& table) { return table.PausedAt(exporter, base); });
}

std::vector<ledger::MappedChunk> ImportSide::PauseAll(const ledger::ExporterId& exporter) {
  return WithTable([&](ledger::ImportTable& table) { return table.PauseAll(exporter); });
}

void ImportSide::Resume(uint64_t target, uint32_t generation) {
  WithTable([&](ledger::ImportTable& table) { table.Resume(target, generation); });
}

std::vector<size_t> ImportSide::PlacementIndexesOf(const ledger::ExporterId& exporter) {
  std::vector<size_t> indexes = WithTable([&](ledger::ImportTable& table) {
    std::vector<size_t> found = in_flight_.LockIndexes(exporter);
    for (uint32_t slot : table.RankSlotsOf(exporter))
      found.push_back(PlacementIndex(slot, exporter.pid));
    return found;
  });
  std::sort(indexes.begin(), indexes.end());
  indexes.erase(std::unique(indexes.begin(), indexes.end()), indexes.end());
  return indexes;
}

uint64_t ImportSide::BeginOpen(const ledger::ExporterId& exporter, size_t placement_index) {
  return WithTable(
      [&](ledger::ImportTable&) { return in_flight_.Begin(exporter, placement_index); });
}

std::vector<ledger::FollowEvent> ImportSide::EndOpen(uint64_t id, bool* overflowed) {
  return WithTable([&](ledger::ImportTable&) { return in_flight_.End(id, overflowed); });
}

bool ImportSide::LogForOpensInFlight(const ledger::ExporterId& exporter,
                                     const ledger::FollowEvent& event) {
  return WithTable([&](ledger::ImportTable&) { return in_flight_.Log(exporter, event); });
}

std::optional<ledger::ZoneLayout> ImportSide::Zone(ReserveZone reserve) {
  std::lock_guard<std::mutex> lock(zone_mutex_);
  if (zone_state_ == ZoneState::kUntried) {
    zone_state_ = ZoneState::kUnavailable;
    if (std::optional<ledger::ZoneLayout> reserved = reserve()) {
      zone_ = *reserved;
      zone_state_ = ZoneState::kReserved;
    }
  }
  if (zone_state_ != ZoneState::kReserved) return std::nullopt;
  return zone_;
}

std::optional<ledger::ZoneLayout> ImportSide::ReservedZone() {
  std::lock_guard<std::mutex> lock(zone_mutex_);
  if (zone_state_ != ZoneState::kReserved) return std::nullopt;
  return zone_;
}

}  // namespace vmmipc::core
