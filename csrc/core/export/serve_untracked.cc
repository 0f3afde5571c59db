// Serving memory vmmipc did not see mapped (made before it was loaded): the
// describe step (core/export/serving.h), chunk by chunk through the driver.
#include <cstdint>
#include <string>

#include "core/export/serving.h"
#include "core/export/vmm_memory.h"
#include "core/real.h"
#include "core/stats.h"

namespace vmmipc::core {
namespace {

// Each chunk was exported from the handle retained at its address; if any
// was re-created meanwhile (its generation moved), the run is torn.
bool Torn(const transport::ServeReply& reply) {
  for (const transport::ChunkGrant& grant : reply.chunks) {
    ChunkInfo now;
    if (DescribeChunk(grant.address, &now) != CUDA_SUCCESS || now.base != grant.address ||
        now.generation != grant.generation)
      return true;
  }
  return false;
}

}  // namespace

bool DescribeRun(Serving* serving) {
  const transport::ServeRequest& request = serving->request;
  RetainedChunk chunk;
  if (chunk.Retain(request.address) != CUDA_SUCCESS)
    return Refuse(serving, transport::RefuseReason::kFreed,
                  fmt::format("0x{:x} is no longer mapped VMM memory", request.address));
  if (chunk.info().base != request.chunk_base || chunk.info().generation != request.generation)
    return Refuse(serving, transport::RefuseReason::kFreed,
                  fmt::format("the chunk at 0x{:x} was freed and re-created since the handle was "
                              "made (generation {} now, {} in the handle)",
                              request.address, chunk.info().generation, request.generation));
  const uint64_t region_end = chunk.info().region_end;
  const uint64_t run_base = chunk.info().base;
  std::vector<transport::ChunkGrant>& chunks = serving->reply.chunks;
  for (;;) {
    const ChunkInfo& info = chunk.info();
    // Known for chunks the cuMemMap hook recorded; the driver cannot say, so
    // a chunk mapped before vmmipc was loaded reads as offset 0.
    if (info.offset != 0) return RefuseOffset(serving, info.base, info.offset);
    if (!info.posix_fd_exportable)
      return Refuse(serving, transport::RefuseReason::kExportFailed,
                    fmt::format("chunk 0x{:x} was created without POSIX fd export", info.base));
    int fd = -1;
    const CUresult exported = VMMIPC_REAL(MemExportToShareableHandle, &fd, chunk.handle(),
                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (exported != CUDA_SUCCESS)
      return Refuse(serving, transport::RefuseReason::kExportFailed,
                    fmt::format("cuMemExportToShareableHandle(0x{:x}) failed: {}", info.base,
                                driver::ErrorName(exported)));
    stats::Count(stats::Counter::kFdsExported);
    transport::ChunkGrant grant;
    grant.fd.Reset(fd);
    grant.address = info.base;
    grant.size = info.size;
    grant.generation = info.generation;
    chunks.push_back(std::move(grant));
    if (chunks.size() > kMaxChunksPerRun)
      return Refuse(
          serving, transport::RefuseReason::kTooManyChunks,
          fmt::format("the run from 0x{:x} has more than {} chunks", run_base, kMaxChunksPerRun));
    // The run goes on while the next address is mapped in the same reservation.
    const uint64_t next = info.base + info.size;
    if (next >= region_end || chunk.Retain(next) != CUDA_SUCCESS || chunk.info().base != next)
      break;
  }
  chunk.Reset();
  if (Torn(serving->reply))
    return Refuse(
        serving, transport::RefuseReason::kFreed,
        fmt::format("the run at 0x{:x} was unmapped or re-created while it was served", run_base));
  return true;
}

}  // namespace vmmipc::core
