// Serving memory the cuMemMap hook recorded: snapshot, check, grant, hold
// (core/export/serving.h).
#include <cstdint>
#include <string>

#include "config/params.h"
#include "core/export/exported_fds.h"
#include "core/export/serving.h"
#include "core/real.h"

namespace vmmipc::core {

void SnapshotRun(ExportSide& exporter, Serving* serving) {
  serving->run =
      exporter.mappings().Run(serving->request.chunk_base, UINT64_MAX, kMaxChunksPerRun + 1);
}

bool CheckRun(Serving* serving) {
  const transport::ServeRequest& request = serving->request;
  std::vector<ledger::VmmMapping>& run = serving->run;
  const ledger::VmmMapping& first = run.front();
  if (first.generation != request.generation || request.address - first.base >= first.size)
    return Refuse(serving, transport::RefuseReason::kFreed,
                  fmt::format("the chunk at 0x{:x} was freed and re-created since the handle was "
                              "made (generation {} now, {} in the handle)",
                              request.chunk_base, first.generation, request.generation));
  // Only the chunks of the same region continue the run.
  const uint64_t region_base = first.region_base, region_end = first.region_end;
  size_t length = 0;
  while (length < run.size() && run[length].region_base == region_base &&
         run[length].region_end == region_end)
    ++length;
  run.resize(length);
  if (run.size() > kMaxChunksPerRun)
    return Refuse(serving, transport::RefuseReason::kTooManyChunks,
                  fmt::format("the run from 0x{:x} has more than {} chunks", run.front().base,
                              kMaxChunksPerRun));
  // Before any fd is exported for it.
  for (const ledger::VmmMapping& chunk : run)
    if (chunk.offset != 0) return RefuseOffset(serving, chunk.base, chunk.offset);
  return true;
}

bool GrantRun(ExportSide& exporter, Serving* serving) {
  for (const ledger::VmmMapping& chunk : serving->run) {
    if (!chunk.posix_fd_exportable)
      return Refuse(serving, transport::RefuseReason::kExportFailed,
                    fmt::format("chunk 0x{:x} was created without POSIX fd export", chunk.base));
    transport::ChunkGrant grant;
    if (const CUresult r = FdForChunk(exporter, chunk, &grant.fd); r != CUDA_SUCCESS)
      return Refuse(serving, transport::RefuseReason::kExportFailed,
                    fmt::format("cuMemExportToShareableHandle(0x{:x}) failed: {}", chunk.base,
                                driver::ErrorName(r)));
    grant.address = chunk.base;
    grant.size = chunk.size;
    grant.generation = chunk.generation;
    serving->reply.chunks.push_back(std::move(grant));
  }
  return true;
}

bool HoldRun(ExportSide& exporter, Serving* serving) {
  // Follow: who holds each chunk, to be told when it is unmapped, recorded
  // in the same step as the last check (ledger/vmm_mappings.h); an importer
  // that does not follow (or that this process does not tell, its follow
  // off) is recorded too, so that the unmap can say who keeps the memory.
  const uint32_t follower = config::Get().follow ? serving->request.follower : 0;
  const uint32_t peer =
      serving->request.peer_pid != 0 ? serving->request.peer_pid : ledger::VmmMappings::kUnknownPid;
  const uint32_t unfollowed = follower == 0 ? peer : 0;
  if (!exporter.mappings().StillMapped(serving->run, follower, unfollowed))
    return Refuse(serving, transport::RefuseReason::kFreed,
                  fmt::format("the run at 0x{:x} was unmapped or re-created while it was served",
                              serving->run.front().base));
  return true;
}

}  // namespace vmmipc::core
