// The import side's table operations, each under the import lock, its zone
// reservation, and its fork reset.
#include "core/import_side.h"

#include "common/parked.h"

namespace vmmipc::core {

std::optional<uint64_t> ImportSide::Reopen(const state::OpenKey& key) {
  return WithTable([&](state::ImportTable& table) { return table.Reopen(key); });
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

void ImportSide::Resume(uint64_t target, uint32_t generation) {
  WithTable([&](state::ImportTable& table) { table.Resume(target, generation); });
}

std::optional<uint32_t> ImportSide::RankSlotOf(const state::ExporterId& exporter) {
  return WithTable([&](state::ImportTable& table) { return table.RankSlotOf(exporter); });
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

bool ImportSide::Watches(uint64_t tag) {
  std::lock_guard<std::mutex> lock(follow_mutex_);
  return watch_client_ && watch_client_->Has(tag);
}

void ImportSide::AbandonAfterFork() noexcept {
  if (!watch_client_) return;
  watch_client_->AbandonAfterFork();
  Park(watch_client_.release());
}

}  // namespace vmmipc::core
