// The export arena's carving and lookups, under its lock.
#include "core/arena/arena_side.h"

#include "common/log.h"

namespace vmmipc::core {

std::optional<uint64_t> ArenaSide::Take(uint64_t size, uint64_t alignment, Reserve reserve) {
  std::lock_guard<std::mutex> lock(arena_mutex_);
  if (state_ == State::kUntried) {
    state_ = State::kUnavailable;
    if (std::optional<Region> region = reserve()) {
      base_ = region->base;
      carver_ = std::make_unique<ledger::ArenaCarver>(region->size);
      state_ = State::kReserved;
    }
  }
  if (state_ != State::kReserved) return std::nullopt;
  if (std::optional<uint64_t> offset = carver_->Take(size, alignment)) return base_ + *offset;
  if (!exhausted_warned_) {
    exhausted_warned_ = true;
    VMMIPC_LOG_WARN(
        "export arena full ({} of {} used, {} asked): this "
        "and later such reservations go to the driver and are not deterministic "
        "(raise VMMIPC_ARENA_SIZE and VMMIPC_SLOT_SIZE)",
        log::Bytes(carver_->used()), log::Bytes(carver_->size()), log::Bytes(size));
  }
  return std::nullopt;
}

ArenaSide::Freed ArenaSide::Give(uint64_t pointer, uint64_t size) {
  std::lock_guard<std::mutex> lock(arena_mutex_);
  if (state_ != State::kReserved || pointer < base_ || pointer - base_ >= carver_->size())
    return Freed::kNotInArena;
  return carver_->Give(pointer - base_, size) ? Freed::kFreed : Freed::kNotACarve;
}

bool ArenaSide::Find(uint64_t address, ArenaCarveInfo* info) {
  std::lock_guard<std::mutex> lock(arena_mutex_);
  if (state_ != State::kReserved || address < base_) return false;
  std::optional<ledger::Carve> carve = carver_->Find(address - base_);
  if (!carve) return false;
  info->arena_base = base_;
  info->base = base_ + carve->offset;
  info->size = carve->size;
  return true;
}

}  // namespace vmmipc::core
