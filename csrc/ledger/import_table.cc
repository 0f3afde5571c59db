// Reference counting of imported chunks and open pointers.
#include "ledger/import_table.h"

#include <algorithm>

namespace vmmipc::ledger {

std::optional<uint64_t> ImportTable::Reopen(const OpenKey& key, Reopener* who) {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return std::nullopt;
  OpenRecord& record = opens_.at(it->second);
  Reopener application{RunState::kOpened, record.device, record.opened_address};
  if (who == nullptr) who = &application;
  if (who->advances_to == RunState::kMappedAhead) return record.pointer;
  if (record.state == RunState::kOpened) {
    ++record.opens;
    who->reopened = true;
    return record.pointer;
  }
  // Adoption: the application's open decides as a fresh open would, so the
  // record must be where that open would have put it.
  if (record.device != who->device || !record.alias_keys.empty()) {
    who->in_the_way = true;
    return std::nullopt;
  }
  if (who->opened_address != record.opened_address) {
    const uint64_t moved = record.pointer + (who->opened_address - record.opened_address);
    if (opens_.count(moved) != 0) {
      who->in_the_way = true;
      return std::nullopt;
    }
    auto node = opens_.extract(record.pointer);
    node.key() = moved;
    node.mapped().pointer = moved;
    node.mapped().opened_address = who->opened_address;
    by_key_[key] = moved;
    opens_.insert(std::move(node));
  }
  OpenRecord& adopted = opens_.at(by_key_.at(key));
  adopted.state = RunState::kOpened;  // its one open is the application's now
  who->adopted = true;
  return adopted.pointer;
}

ChunkProbe ImportTable::Probe(uint64_t target, uint64_t size, const ExporterId& exporter,
                              uint64_t exporter_address, uint32_t generation) const {
  // The first chunk starting at or after `target`, and the one before it.
  auto next = chunks_.lower_bound(target);
  if (next != chunks_.end() && next->first == target) {
    const MappedChunk& c = next->second;
    const bool same = c.size == size && c.exporter == exporter &&
                      c.exporter_address == exporter_address && c.generation == generation;
    return same ? ChunkProbe::kSame : ChunkProbe::kConflict;
  }
  if (next != chunks_.end() && next->first < target + size) return ChunkProbe::kConflict;
  if (next != chunks_.begin()) {
    const MappedChunk& prev = std::prev(next)->second;
    if (prev.target + prev.size > target) return ChunkProbe::kConflict;
  }
  return ChunkProbe::kFree;
}

void ImportTable::AddChunk(const MappedChunk& chunk) {
  MappedChunk copy = chunk;
  copy.users = 0;
  chunks_[chunk.target] = copy;
}

PointerUse ImportTable::UseOf(uint64_t pointer, uint64_t run_base, uint64_t run_size) const {
  auto it = opens_.find(pointer);
  if (it == opens_.end()) return PointerUse::kFree;
  return it->second.run_base == run_base && it->second.run_size == run_size ? PointerUse::kSameRun
                                                                            : PointerUse::kOtherRun;
}

bool ImportTable::AddOpen(OpenRecord record) {
  if (auto existing = opens_.find(record.pointer); existing != opens_.end()) {
    // Core checked UseOf: the same run, its chunks already counted.
    if (record.state == RunState::kMappedAhead) return false;  // mapped already: nothing to do
    if (existing->second.state == RunState::kMappedAhead)
      existing->second.state = RunState::kOpened;  // adopted: its one open is this one
    else
      ++existing->second.opens;
    existing->second.alias_keys.push_back(record.key);
    by_key_[record.key] = record.pointer;
    return true;
  }
  for (uint64_t target : record.chunks) ++chunks_.at(target).users;
  record.opens = 1;
  if (record.state == RunState::kOpened)
    first_slots_.emplace(record.key.exporter,
                         record.zone_slot);  // kNotInZone: best-effort, never ahead
  if (record.zone_slot != kNotInZone) {
    SlotUse& use = slots_[record.zone_slot];
    use.exporter = record.key.exporter;  // core checked SlotOwner under the slot's lock
    ++use.opens;
  }
  by_key_[record.key] = record.pointer;
  const uint64_t pointer = record.pointer;
  opens_[pointer] = std::move(record);
  return true;
}

CloseResult ImportTable::Close(uint64_t pointer) {
  CloseResult result;
  auto it = opens_.find(pointer);
  if (it == opens_.end() || it->second.state != RunState::kOpened) return result;
  result.ours = true;
  if (--it->second.opens > 0) return result;
  Remove(it, &result);
  return result;
}

CloseResult ImportTable::DropAhead(const ExporterId& exporter, uint64_t exporter_address,
                                   bool all) {
  CloseResult result;
  for (auto it = opens_.begin(); it != opens_.end();) {
    const OpenRecord& record = it->second;
    bool drop = record.state == RunState::kMappedAhead && record.key.exporter == exporter;
    if (drop && !all)
      drop = std::any_of(record.chunks.begin(), record.chunks.end(), [&](uint64_t target) {
        auto chunk = chunks_.find(target);
        return chunk != chunks_.end() && chunk->second.exporter_address == exporter_address;
      });
    auto next = std::next(it);
    if (drop) {
      result.ours = true;
      Remove(it, &result);
    }
    it = next;
  }
  return result;
}

CloseResult ImportTable::DropAheadKey(const OpenKey& key) {
  CloseResult result;
  auto by_key = by_key_.find(key);
  if (by_key == by_key_.end()) return result;
  auto it = opens_.find(by_key->second);
  if (it == opens_.end() || it->second.state != RunState::kMappedAhead) return result;
  result.ours = true;
  Remove(it, &result);
  return result;
}

AheadUse ImportTable::AheadOf(const ExporterId& exporter) const {
  AheadUse use;
  for (const auto& [pointer, record] : opens_) {
    if (record.state != RunState::kMappedAhead || record.key.exporter != exporter) continue;
    use.chunks += record.chunks.size();
    use.bytes += record.run_size;
  }
  return use;
}

std::optional<uint32_t> ImportTable::FirstSlotOf(const ExporterId& exporter) const {
  auto it = first_slots_.find(exporter);
  if (it == first_slots_.end()) return std::nullopt;
  return it->second;
}

void ImportTable::Remove(std::map<uint64_t, OpenRecord>::iterator it, CloseResult* out) {
  CloseResult& result = *out;
  OpenRecord& record = it->second;
  result.last = true;
  for (uint64_t target : record.chunks) {
    auto chunk = chunks_.find(target);
    if (chunk == chunks_.end()) continue;
    if (--chunk->second.users == 0) {
      result.to_unmap.push_back(chunk->second);
      chunks_.erase(chunk);
    }
  }
  if (auto slot = slots_.find(record.zone_slot); slot != slots_.end() && --slot->second.opens == 0)
    slots_.erase(slot);
  if (record.private_reservation != 0) {
    // One record's reservation per result: DropAhead never takes a private
    // one (runs mapped ahead are placed in the zone only).
    result.free_reservation = record.private_reservation;
    result.free_reservation_size = record.private_reservation_size;
  }
  by_key_.erase(record.key);
  for (const OpenKey& alias : record.alias_keys) by_key_.erase(alias);
  opens_.erase(it);
}

std::vector<MappedChunk> ImportTable::TakeUnused(const std::vector<uint64_t>& targets) {
  std::vector<MappedChunk> unused;
  for (uint64_t target : targets) {
    auto chunk = chunks_.find(target);
    if (chunk != chunks_.end() && chunk->second.users == 0) {
      unused.push_back(chunk->second);
      chunks_.erase(chunk);
    }
  }
  return unused;
}

std::optional<OpenKey> ImportTable::KeyOf(uint64_t pointer) const {
  auto it = opens_.find(pointer);
  if (it == opens_.end()) return std::nullopt;
  return it->second.key;
}

std::optional<ExporterId> ImportTable::SlotOwner(uint32_t slot) const {
  auto it = slots_.find(slot);
  if (it == slots_.end()) return std::nullopt;
  return it->second.exporter;
}

bool ImportTable::FirstCollision(uint32_t slot, const ExporterId& exporter) {
  return collisions_warned_.emplace(slot, exporter).second;
}

std::vector<MappedChunk> ImportTable::Pause(const ExporterId& exporter, uint64_t exporter_address,
                                            uint32_t generation) {
  std::vector<MappedChunk> paused;
  for (auto& [target, chunk] : chunks_) {
    if (chunk.paused || chunk.exporter != exporter || chunk.exporter_address != exporter_address ||
        chunk.generation != generation)
      continue;
    chunk.paused = true;
    paused.push_back(chunk);
  }
  return paused;
}

std::vector<MappedChunk> ImportTable::PauseAll(const ExporterId& exporter) {
  std::vector<MappedChunk> paused;
  for (auto& [target, chunk] : chunks_) {
    if (chunk.paused || chunk.exporter != exporter) continue;
    chunk.paused = true;
    paused.push_back(chunk);
  }
  return paused;
}

std::vector<MappedChunk> ImportTable::PausedAt(const ExporterId& exporter,
                                               uint64_t exporter_address) const {
  std::vector<MappedChunk> paused;
  for (const auto& [target, chunk] : chunks_)
    if (chunk.paused && chunk.exporter == exporter && chunk.exporter_address == exporter_address)
      paused.push_back(chunk);
  return paused;
}

void ImportTable::Resume(uint64_t target, uint32_t generation) {
  auto it = chunks_.find(target);
  if (it == chunks_.end()) return;
  it->second.paused = false;
  it->second.generation = generation;
}

std::vector<MappedChunk> ImportTable::ChunksIn(uint64_t begin, uint64_t end) const {
  std::vector<MappedChunk> found;
  auto it = chunks_.lower_bound(begin);
  if (it != chunks_.begin()) {
    auto before = std::prev(it);
    if (before->second.target + before->second.size > begin) found.push_back(before->second);
  }
  for (; it != chunks_.end() && it->first < end; ++it) found.push_back(it->second);
  return found;
}

std::vector<uint32_t> ImportTable::RankSlotsOf(const ExporterId& exporter) const {
  std::vector<uint32_t> slots;
  for (const auto& [pointer, record] : opens_)
    if (record.key.exporter == exporter &&
        std::find(slots.begin(), slots.end(), record.key.rank_slot) == slots.end())
      slots.push_back(record.key.rank_slot);
  return slots;
}

const OpenRecord* ImportTable::FindByAddress(uint64_t address) const {
  // Records are keyed by pointer, which lies inside their run; runs of
  // different records may overlap (two handles into one span), any match
  // answers the range question the same way only if runs coincide, so pick
  // the record whose run starts last at or before the address.
  const OpenRecord* best = nullptr;
  for (const auto& [pointer, record] : opens_) {
    if (address >= record.run_base && address - record.run_base < record.run_size &&
        (best == nullptr || record.run_base > best->run_base))
      best = &record;
  }
  return best;
}

}  // namespace vmmipc::ledger
