// The exporter's side: cuIpcGetMemHandle on VMM memory (metadata only, no fd
// until a peer asks) and the listener's handler that answers peers with the
// chunks of the run and their fds.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <optional>

#include "common/elapsed.h"
#include "common/log.h"
#include "common/syscall.h"
#include "config/params.h"
#include "core/arena/export_arena.h"
#include "core/export/export_ahead.h"
#include "core/export/exported_fds.h"
#include "core/export/fd_cache_limit.h"
#include "core/export/rank_slot.h"
#include "core/export/vmm_memory.h"
#include "core/handle_fields.h"
#include "core/hooks.h"
#include "core/process_state.h"
#include "core/real.h"
#include "core/stats.h"
#include "driver/status.h"
#include "state/handle_codec.h"
#include "transport/socket_io.h"
#include "transport/wire.h"

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

// Called by the listener for every authenticated request.
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

// Starts the listener, on the first export (under the export side's lock,
// ExportSide::EnsureListener); `context` is the one its threads will use.
std::unique_ptr<transport::Listener> StartListener(ProcessState& state, void** context) {
  if (!state.has_secret) {
    // The export side remembers it (as a listener that cannot start): one line.
    VMMIPC_LOG_ERROR(
        "no randomness for this process's handle secret (getrandom: {}; /dev/urandom: {}); "
        "VMM memory cannot be exported from this process (cuIpcGetMemHandle returns "
        "CUDA_ERROR_OPERATING_SYSTEM); opening other processes' handles works",
        ErrnoText(state.no_secret.getrandom_error), ErrnoText(state.no_secret.urandom_error));
    return nullptr;
  }
  CUcontext current = nullptr;
  if (VMMIPC_REAL(CtxGetCurrent, &current) == CUDA_SUCCESS) *context = current;
  const config::Params& params = config::Get();
  transport::ListenerOptions options;
  options.secret = state.secret;
  options.pid = state.pid;
  options.instance = state.instance;  // names the socket: unique across pid namespaces
  options.socket_dir = params.socket_dir;
  options.timeout_ms = static_cast<int>(params.timeout_ms);
  options.max_workers = static_cast<int>(params.listener_threads);
  options.keep_watchers = params.follow;
  // A lagging follower's catch-up resume: the memory mapped at `base` now,
  // if it is still the generation the follower missed (on the listener's thread).
  options.resume_fd = [](uint64_t base, uint32_t generation) {
    ProcessState& state = State();
    UseExportContext(state.exporter);
    ScopedFd fd;
    const std::optional<state::VmmMapping> mapping = state.exporter.mappings().Find(base);
    if (!mapping || mapping->base != base || mapping->generation != generation ||
        !mapping->posix_fd_exportable || FdForChunk(state.exporter, *mapping, &fd) != CUDA_SUCCESS)
      return ScopedFd();
    return fd;
  };
  // Refusals the transport makes itself (uid, MAC, malformed) never reach
  // Serve: count every refusal, grant and drop where it is sent.
  options.events.refused = [](transport::RefuseReason reason) { stats::CountRefusal(reason); };
  options.events.granted = [](size_t chunks) { stats::Count(stats::Counter::kFdsSent, chunks); };
  options.events.dropped = [] { stats::Count(stats::Counter::kConnectionsDropped); };
  options.events.reaped = [] { stats::Count(stats::Counter::kConnectionsReaped); };
  state.exporter.mappings().SetFdCacheLimit(FdCacheLimit(params.export_fd_cache));
  std::string error;
  std::unique_ptr<transport::Listener> listener =
      transport::Listener::Start(options, Serve, &error);
  if (!listener) {
    // The export side remembers it: every later export fails fast.
    VMMIPC_LOG_ERROR(
        "cannot start the export listener: {}; VMM memory cannot be exported "
        "from this process",
        error);
    return nullptr;
  }
  if (state.rank >= 0)
    VMMIPC_LOG_INFO("vmmipc {} exporting: rank {} (from {}), listening on {}",
                    VMMIPC_VERSION_STRING, state.rank, params.rank_source, listener->address());
  else
    VMMIPC_LOG_INFO(
        "vmmipc {} exporting: no rank variable, {}, listening on {}", VMMIPC_VERSION_STRING,
        params.slot_from_gpu() ? "slots from the GPU"
                               : fmt::format("unranked (VMMIPC_RANK_FROM={})", params.rank_from),
        listener->address());
  return listener;
}

}  // namespace

CUresult IpcGetMemHandle(CUipcMemHandle* out, CUdeviceptr address) {
  if (out == nullptr) return VMMIPC_REAL(IpcGetMemHandle, out, address);
  // Memory mapped through vmmipc's cuMemMap hook is described from the
  // mapping table, with no driver call. Anything else asks the real driver
  // first: legacy memory keeps its legacy handle, untouched.
  ChunkInfo chunk;
  if (!DescribeTracked(address, &chunk)) {
    const CUresult legacy = VMMIPC_REAL(IpcGetMemHandle, out, address);
    if (legacy != CUDA_ERROR_INVALID_VALUE) return legacy;
    if (DescribeChunk(address, &chunk) != CUDA_SUCCESS) return legacy;  // not VMM memory either
  }
  if (!chunk.posix_fd_exportable) {
    stats::Count(stats::Counter::kExportRefusedNoPosixFd);
    VMMIPC_LOG_WARN(
        "cuIpcGetMemHandle(0x{:x}): VMM memory created without "
        "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR cannot be shared (created before "
        "vmmipc was loaded, or VMMIPC_FORCE_POSIX_FD=0)",
        address);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (chunk.offset != 0) {
    stats::Count(stats::Counter::kExportRefusedOther);
    VMMIPC_LOG_WARN(
        "cuIpcGetMemHandle(0x{:x}): the mapping starts at offset 0x{:x} of its "
        "allocation; vmmipc shares mappings of whole allocations from offset 0 only",
        address, chunk.offset);
    return CUDA_ERROR_INVALID_VALUE;
  }
  const uint64_t region_base = chunk.region_base;

  ProcessState& state = State();
  if (!state.exporter.EnsureListener(
          [&state](void** context) { return StartListener(state, context); })) {
    stats::Count(stats::Counter::kExportRefusedNoListener);
    return CUDA_ERROR_OPERATING_SYSTEM;
  }
  state::Vmm2Handle handle;
  handle.rank_slot = SlotForExport(state, chunk.device);
  handle.pid = state.pid;
  handle.generation = chunk.generation;
  handle.instance = state.instance;
  handle.address = address;
  handle.chunk_size = chunk.size;
  handle.chunk_base = chunk.base;
  handle.region_base = region_base;
  // The handle grants what it names, nothing else (docs/security.md): the
  // listener serves a request only under this MAC of exactly these fields.
  handle.capability = transport::wire::Capability(state.secret, FieldsOf(handle));
  state::EncodeHandle(handle, reinterpret_cast<unsigned char*>(out->reserved));
  stats::Count(stats::Counter::kHandlesExported);
  if (!chunk.export_cached && chunk.posix_fd_exportable)
    QueueExportAhead(state.exporter, chunk.base);
  VMMIPC_LOG_DEBUG("exported 0x{:x} (chunk 0x{:x}+0x{:x}, region 0x{:x}, generation {})", address,
                   chunk.base, chunk.size, region_base, chunk.generation);
  return CUDA_SUCCESS;
}

}  // namespace vmmipc::core
