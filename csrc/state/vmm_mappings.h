// VmmMappings: the process's own VMM mappings, as made through cuMemMap and
// undone through cuMemUnmap, so that cuIpcGetMemHandle and the listener can
// describe exported memory without asking the driver. Each mapping gets a
// generation when it is made: memory unmapped and mapped again at the same
// address is new memory to an importer. Thread-safe; no driver calls.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <shared_mutex>

namespace vmmipc::state {

struct VmmMapping {
  uint64_t base = 0;           // the mapping: [base, base + size)
  uint64_t size = 0;
  uint64_t offset = 0;         // into its allocation (vmmipc exports offset-0 mappings only)
  uint32_t generation = 0;
  bool posix_fd_exportable = false;
  uint64_t region_base = 0;    // what importers mirror: the arena or the reservation
  uint64_t region_end = 0;     // where a run of chunks stops: the end of the reservation
};

class VmmMappings {
 public:
  // Records a new mapping (replacing any record it overlaps) and returns its generation.
  uint32_t Add(VmmMapping mapping);
  // Forgets every mapping that overlaps [base, base + size).
  void Remove(uint64_t base, uint64_t size);
  std::optional<VmmMapping> Find(uint64_t address) const;
  size_t size() const;

 private:
  void RemoveLocked(uint64_t base, uint64_t size);
  mutable std::shared_mutex mutex_;
  std::map<uint64_t, VmmMapping> mappings_;  // by base
  uint32_t next_generation_ = 0x80000000u;   // apart from handle generations (ChunkGenerations)
};

}  // namespace vmmipc::state
