// Generation bookkeeping for exported chunks.
#include "ledger/chunk_generations.h"

namespace vmmipc::ledger {

uint32_t ChunkGenerations::NextLocked() {
  if (++next_ == 0) ++next_;  // 0 never names a chunk
  return next_;
}

uint32_t ChunkGenerations::OnCreate(uint64_t handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  return generations_[handle] = NextLocked();
}

void ChunkGenerations::OnRelease(uint64_t handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  generations_.erase(handle);
}

uint32_t ChunkGenerations::GetOrAssign(uint64_t handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto [it, inserted] = generations_.try_emplace(handle, 0);
  if (inserted) it->second = NextLocked();
  return it->second;
}

size_t ChunkGenerations::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return generations_.size();
}

}  // namespace vmmipc::ledger
