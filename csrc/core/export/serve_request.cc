// Serving one request of a peer: the run of the process's own VMM memory
// from the handle's chunk, each chunk with its fd, or a refusal that says why.
#include "core/export/serve_request.h"

#include <cstdint>
#include <optional>

#include "common/elapsed.h"
#include "common/log.h"
#include "config/params.h"
#include "core/export/exported_fds.h"
#include "core/export/vmm_memory.h"
#include "core/process_state.h"
#include "core/real.h"
#include "core/stats.h"
#include "driver/status.h"
#include "transport/socket_io.h"

namespace vmmipc::core {
namespace {

// More chunks than this in one run is refused rather than sending an
// unbounded stream of fds (64 Ki chunks of 2 MiB is already 128 GiB).
constexpr size_t kMaxChunksPerRun = 65536;

transport::ServeReply Refuse(transport::RefuseReason reason, std::string detail) {
  transport::ServeReply reply;
  reply.refuse = reason;
  reply.detail = std::move(detail);
  return reply;
}

// The wire names no offset: an importer maps each chunk's fd from offset 0 of
// its allocation. A chunk mapped at another offset (today's driver refuses
// such a cuMemMap; the simulator and a later driver may not) would put other
// bytes at its place in the run, so the whole request is refused: callers add
// offsets within the run, and a run silently cut short before that chunk
// would fault later, far from the cause.
transport::ServeReply RefuseOffset(uint64_t chunk_base, uint64_t offset) {
  return Refuse(transport::RefuseReason::kExportFailed,
                fmt::format("chunk 0x{:x} of the run is mapped at offset 0x{:x} of its "
                            "allocation; vmmipc shares chunks mapped from offset 0 only",
                            chunk_base, offset));
}

// The run of memory the exporter made through vmmipc's cuMemMap hook: one
// snapshot of the mapping table, fds from the cache, and a last check that
// nothing of the run was unmapped meanwhile (the unmap hook takes a record
// out before the driver unmaps), so that every chunk granted belongs to the
// generation the snapshot saw: never a torn run of old and new memory.
transport::ServeReply ServeTracked(ProcessState& state, const transport::ServeRequest& request,
                                   std::vector<state::VmmMapping> run) {
  const state::VmmMapping& first = run.front();
  if (first.generation != request.generation || request.address - first.base >= first.size)
    return Refuse(transport::RefuseReason::kFreed,
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
    return Refuse(
        transport::RefuseReason::kTooManyChunks,
        fmt::format("the run from 0x{:x} has more than {} chunks", first.base, kMaxChunksPerRun));
  // Before any fd is exported for it.
  for (const state::VmmMapping& chunk : run)
    if (chunk.offset != 0) return RefuseOffset(chunk.base, chunk.offset);
  transport::ServeReply reply;
  for (const state::VmmMapping& chunk : run) {
    if (!chunk.posix_fd_exportable)
      return Refuse(transport::RefuseReason::kExportFailed,
                    fmt::format("chunk 0x{:x} was created without POSIX fd export", chunk.base));
    transport::ChunkGrant grant;
    if (const CUresult r = FdForChunk(state.exporter, chunk, &grant.fd); r != CUDA_SUCCESS)
      return Refuse(transport::RefuseReason::kExportFailed,
                    fmt::format("cuMemExportToShareableHandle(0x{:x}) failed: {}", chunk.base,
                                driver::ErrorName(r)));
    grant.address = chunk.base;
    grant.size = chunk.size;
    grant.generation = chunk.generation;
    reply.chunks.push_back(std::move(grant));
  }
  // Follow: who holds each chunk, to be told when it is unmapped, recorded
  // in the same step as the last check (state/vmm_mappings.h).
  const uint32_t follower = config::Get().follow ? request.follower : 0;
  if (!state.exporter.mappings().StillMapped(run, follower))
    return Refuse(transport::RefuseReason::kFreed,
                  fmt::format("the run at 0x{:x} was unmapped or re-created while it was served",
                              first.base));
  return reply;
}

// Memory vmmipc did not see mapped (made before it was loaded): described by
// the driver, exported per request, and re-checked chunk by chunk at the end.
transport::ServeReply ServeUntracked(const transport::ServeRequest& request) {
  RetainedChunk chunk;
  if (chunk.Retain(request.address) != CUDA_SUCCESS)
    return Refuse(transport::RefuseReason::kFreed,
                  fmt::format("0x{:x} is no longer mapped VMM memory", request.address));
  if (chunk.info().base != request.chunk_base || chunk.info().generation != request.generation)
    return Refuse(transport::RefuseReason::kFreed,
                  fmt::format("the chunk at 0x{:x} was freed and re-created since the handle was "
                              "made (generation {} now, {} in the handle)",
                              request.address, chunk.info().generation, request.generation));
  const uint64_t region_end = chunk.info().region_end;
  const uint64_t run_base = chunk.info().base;
  transport::ServeReply reply;
  for (;;) {
    const ChunkInfo& info = chunk.info();
    // Known for chunks the cuMemMap hook recorded; the driver cannot say, so
    // a chunk mapped before vmmipc was loaded reads as offset 0.
    if (info.offset != 0) return RefuseOffset(info.base, info.offset);
    if (!info.posix_fd_exportable)
      return Refuse(transport::RefuseReason::kExportFailed,
                    fmt::format("chunk 0x{:x} was created without POSIX fd export", info.base));
    int fd = -1;
    const CUresult exported = VMMIPC_REAL(MemExportToShareableHandle, &fd, chunk.handle(),
                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (exported != CUDA_SUCCESS)
      return Refuse(transport::RefuseReason::kExportFailed,
                    fmt::format("cuMemExportToShareableHandle(0x{:x}) failed: {}", info.base,
                                driver::ErrorName(exported)));
    stats::Count(stats::Counter::kFdsExported);
    transport::ChunkGrant grant;
    grant.fd.Reset(fd);
    grant.address = info.base;
    grant.size = info.size;
    grant.generation = info.generation;
    reply.chunks.push_back(std::move(grant));
    if (reply.chunks.size() > kMaxChunksPerRun)
      return Refuse(
          transport::RefuseReason::kTooManyChunks,
          fmt::format("the run from 0x{:x} has more than {} chunks", run_base, kMaxChunksPerRun));
    // The run goes on while the next address is mapped in the same reservation.
    const uint64_t next = info.base + info.size;
    if (next >= region_end || chunk.Retain(next) != CUDA_SUCCESS || chunk.info().base != next)
      break;
  }
  chunk.Reset();
  // Each chunk was exported from the handle retained at its address; if any
  // was re-created meanwhile (its generation moved), the run is torn.
  for (const transport::ChunkGrant& grant : reply.chunks) {
    ChunkInfo now;
    if (DescribeChunk(grant.address, &now) != CUDA_SUCCESS || now.base != grant.address ||
        now.generation != grant.generation)
      return Refuse(transport::RefuseReason::kFreed,
                    fmt::format("the run at 0x{:x} was unmapped or re-created while it was served",
                                run_base));
  }
  return reply;
}

transport::ServeReply ServeRun(const transport::ServeRequest& request) {
  ProcessState& state = State();
  UseExportContext(state.exporter);
  std::vector<state::VmmMapping> run =
      state.exporter.mappings().Run(request.chunk_base, UINT64_MAX, kMaxChunksPerRun + 1);
  if (!run.empty()) return ServeTracked(state, request, std::move(run));
  return ServeUntracked(request);
}

}  // namespace

transport::ServeReply Serve(const transport::ServeRequest& request) {
  const auto start = SteadyClock::now();
  transport::ServeReply reply = ServeRun(request);
  if (reply.refuse != transport::RefuseReason::kNone) {
    reply.chunks.clear();  // nothing of a refused request is sent (counted when sent)
    return reply;
  }
  stats::Count(stats::Counter::kRequestsServed);
  stats::Count(stats::Counter::kChunksServed, reply.chunks.size());
  VMMIPC_LOG_DEBUG("served 0x{:x} to {}: {} chunks in {} us", request.address,
                   transport::PeerPidText(request.peer_pid), reply.chunks.size(),
                   MicrosSince(start));
  return reply;
}

}  // namespace vmmipc::core
