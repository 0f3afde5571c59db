// Questions about this process's own VMM memory, answered by the real driver:
// which chunk (one cuMemMap) holds an address, which region (reservation)
// holds it, whether it can be exported as a POSIX fd, and the run of chunks
// mapped back to back from it.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>
#include <vector>

namespace vmmipc::core {

struct ChunkInfo {
  uint64_t base = 0;  // the one mapping holding the address
  uint64_t size = 0;
  uint64_t offset = 0;  // of the mapping into its allocation (known when tracked)
  uint32_t generation = 0;
  bool posix_fd_exportable = false;
  int32_t device = -1;         // ordinal of the GPU that holds the memory; -1 not a device
  uint64_t region_base = 0;    // what importers mirror (the arena or the reservation)
  uint64_t region_end = 0;     // where a run stops (end of the carve or reservation)
  bool export_cached = false;  // tracked, and its exported fd is cached (no export on request)
};

// The placement base and run limit of an exporter address: the arena and the
// carve's end inside the export arena, else the driver reservation.
CUresult ExportRegionOf(uint64_t address, uint64_t* region_base, uint64_t* region_end);

// Describes own VMM memory from the mapping table (no driver call), when the
// mapping was made through vmmipc's cuMemMap hook.
bool DescribeTracked(uint64_t address, ChunkInfo* info);

// The chunk at an address with its allocation handle retained, released on
// destruction: one retain serves the description and the export.
class RetainedChunk {
 public:
  RetainedChunk() = default;
  RetainedChunk(const RetainedChunk&) = delete;
  RetainedChunk& operator=(const RetainedChunk&) = delete;
  ~RetainedChunk() { Reset(); }
  // Retains and describes the chunk at `address`; CUDA_ERROR_INVALID_VALUE
  // (not logged) when the address is not mapped VMM memory.
  CUresult Retain(uint64_t address);
  void Reset();
  const ChunkInfo& info() const { return info_; }
  CUmemGenericAllocationHandle handle() const { return handle_; }

 private:
  ChunkInfo info_;
  CUmemGenericAllocationHandle handle_ = 0;
  bool held_ = false;
};

// Describes the VMM chunk at `address`. Returns CUDA_ERROR_INVALID_VALUE,
// without logging, when the address is not VMM memory (legacy memory,
// unmapped, unknown): callers then keep the driver's own answer.
CUresult DescribeChunk(uint64_t address, ChunkInfo* info);

// The reservation holding `address`: [base, base + size).
CUresult RegionOf(uint64_t address, uint64_t* base, uint64_t* size);

}  // namespace vmmipc::core
