// ChunkGenerations: the exporter's identity for each physical chunk, keyed by
// the driver's allocation handle value. A chunk freed and re-created at the
// same address gets a new generation, so an importer never mistakes the new
// memory for the old. Thread-safe; no driver calls.
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace vmmipc::ledger {

class ChunkGenerations {
 public:
  // A new chunk was created with this handle value (overwrites a reused value).
  uint32_t OnCreate(uint64_t handle);
  // The creator released its handle.
  void OnRelease(uint64_t handle);
  // The generation of a handle, assigned now if the handle was never seen
  // (created before tracking, or released while still mapped).
  uint32_t GetOrAssign(uint64_t handle);
  size_t size() const;

 private:
  uint32_t NextLocked();
  mutable std::mutex mutex_;
  std::unordered_map<uint64_t, uint32_t> generations_;
  uint32_t next_ = 0;
};

}  // namespace vmmipc::ledger
