// The exporter's side: cuIpcGetMemHandle on VMM memory (metadata only, no fd
// until a peer asks) and the listener's handler that answers peers with the
// chunks of the run and their fds.
#include <unistd.h>

#include <chrono>

#include "common/log.h"
#include "common/status.h"
#include "config/params.h"
#include "core/export_arena.h"
#include "core/ipc.h"
#include "core/process_state.h"
#include "core/stats.h"
#include "core/vmm_memory.h"
#include "driver/real_driver.h"
#include "state/handle_codec.h"

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

// Runs on the listener thread. It has no context of its own: use the one the
// first export ran in (export itself works without one, measured, but the
// range queries are not measured that way).
transport::ServeReply ServeRun(const transport::ServeRequest& request);

transport::ServeReply Serve(const transport::ServeRequest& request) {
  const auto start = std::chrono::steady_clock::now();
  transport::ServeReply reply = ServeRun(request);
  if (reply.refuse != transport::RefuseReason::kNone) {
    reply.chunks.clear();  // nothing of a refused request is sent (counted when sent)
  } else {
    stats::Count(stats::Counter::kRequestsServed);
    stats::Count(stats::Counter::kChunksServed, reply.chunks.size());
  }
  if (reply.refuse == transport::RefuseReason::kNone)
    VMMIPC_LOG_DEBUG("served 0x{:x} to pid {}: {} chunks in {} us", request.address,
                     request.peer_pid, reply.chunks.size(),
                     std::chrono::duration_cast<std::chrono::microseconds>(
                         std::chrono::steady_clock::now() - start)
                         .count());
  return reply;
}

transport::ServeReply ServeRun(const transport::ServeRequest& request) {
  using Clock = std::chrono::steady_clock;
  auto us = [](Clock::time_point from) {
    return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - from).count();
  };
  const auto start = Clock::now();
  ProcessState& state = State();
  // The listener thread has no context of its own: give it the one the first
  // export ran in, once (export works without one, measured, but the range
  // queries were not measured that way).
  static thread_local bool context_set = false;
  if (!context_set && state.export_context != nullptr) {
    context_set = VMMIPC_REAL(CtxSetCurrent, static_cast<CUcontext>(state.export_context)) ==
                  CUDA_SUCCESS;
  }

  RetainedChunk chunk;
  if (chunk.Retain(request.address) != CUDA_SUCCESS)
    return Refuse(transport::RefuseReason::kFreed,
                  fmt::format("0x{:x} is no longer mapped VMM memory", request.address));
  if (chunk.info().base != request.chunk_base ||
      chunk.info().generation != static_cast<uint32_t>(request.generation))
    return Refuse(transport::RefuseReason::kFreed,
                  fmt::format("the chunk at 0x{:x} was freed and re-created since the handle was "
                              "made (generation {} now, {} in the handle)",
                              request.address, chunk.info().generation, request.generation));
  const uint64_t region_end = chunk.info().region_end;

  const auto loop_start = Clock::now();
  const int64_t first_us = us(start);
  transport::ServeReply reply;
  const uint64_t run_base = chunk.info().base;
  for (;;) {
    const ChunkInfo& info = chunk.info();
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
    transport::ChunkGrant grant;
    grant.fd.Reset(fd);
    grant.address = info.base;
    grant.size = info.size;
    grant.generation = info.generation;
    reply.chunks.push_back(std::move(grant));
    if (reply.chunks.size() > kMaxChunksPerRun)
      return Refuse(transport::RefuseReason::kTooManyChunks,
                    fmt::format("the run from 0x{:x} has more than {} chunks", run_base,
                                kMaxChunksPerRun));
    // The run goes on while the next address is mapped in the same reservation.
    const uint64_t next = info.base + info.size;
    if (next >= region_end || chunk.Retain(next) != CUDA_SUCCESS ||
        chunk.info().base != next)
      break;
  }
  VMMIPC_LOG_DEBUG("serve phases: context, first chunk and region {} us; {} chunks exported in "
                   "{} us", first_us, reply.chunks.size(), us(loop_start));
  return reply;
}

// Starts the listener on the first export. Caller holds export_mutex.
CUresult EnsureListenerLocked(ProcessState& state) {
  if (state.listener) return CUDA_SUCCESS;
  if (state.listener_failed) return CUDA_ERROR_OPERATING_SYSTEM;
  CUcontext context = nullptr;
  if (VMMIPC_REAL(CtxGetCurrent, &context) == CUDA_SUCCESS) state.export_context = context;
  const config::Params& params = config::Get();
  transport::ListenerOptions options;
  options.token = state.token;
  options.pid = state.pid;
  options.socket_dir = params.socket_dir;
  options.timeout_ms = static_cast<int>(params.timeout_ms);
  // Refusals the transport makes itself (uid, MAC, malformed) never reach
  // Serve: count every refusal, grant and drop where it is sent.
  options.events.refused = [](transport::RefuseReason reason) { stats::CountRefusal(reason); };
  options.events.granted = [](size_t chunks) { stats::Count(stats::Counter::kFdsSent, chunks); };
  options.events.dropped = [] { stats::Count(stats::Counter::kConnectionsDropped); };
  std::string error;
  state.listener = transport::Listener::Start(options, Serve, &error);
  if (!state.listener) {
    // Remembered so that every later export fails fast with the same reason.
    state.listener_failed = true;
    VMMIPC_LOG_ERROR("cannot start the export listener: {}; VMM memory cannot be exported "
                     "from this process", error);
    return CUDA_ERROR_OPERATING_SYSTEM;
  }
  state.listener_ready.store(true, std::memory_order_release);
  VMMIPC_LOG_INFO("vmmipc {} exporting: rank {} ({}), listening on {}", VMMIPC_VERSION_STRING,
                  state.rank, params.rank_source, state.listener->address());
  return CUDA_SUCCESS;
}

}  // namespace

CUresult IpcGetMemHandle(CUipcMemHandle* out, CUdeviceptr address) {
  if (out == nullptr || !Active()) return VMMIPC_REAL(IpcGetMemHandle, out, address);
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
    VMMIPC_LOG_WARN("cuIpcGetMemHandle(0x{:x}): VMM memory created without "
                    "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR cannot be shared (created before "
                    "vmmipc was loaded, or VMMIPC_FORCE_POSIX_FD=0)", address);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (chunk.offset != 0) {
    stats::Count(stats::Counter::kExportRefusedOther);
    VMMIPC_LOG_WARN("cuIpcGetMemHandle(0x{:x}): the mapping starts at offset 0x{:x} of its "
                    "allocation; vmmipc shares mappings of whole allocations from offset 0 only",
                    address, chunk.offset);
    return CUDA_ERROR_INVALID_VALUE;
  }
  const uint64_t region_base = chunk.region_base;

  ProcessState& state = State();
  if (!state.listener_ready.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(state.export_mutex);
    if (const CUresult started = EnsureListenerLocked(state); started != CUDA_SUCCESS) {
      stats::Count(stats::Counter::kExportRefusedNoListener);
      return started;
    }
  }
  state::Vmm2Handle handle;
  handle.rank_slot = state.rank >= 0 ? static_cast<uint16_t>(state.rank) : state::kUnranked;
  handle.pid = state.pid;
  handle.generation = chunk.generation;
  handle.token = state.token;
  handle.address = address;
  handle.chunk_size = chunk.size;
  handle.chunk_base = chunk.base;
  handle.region_base = region_base;
  state::EncodeHandle(handle, reinterpret_cast<unsigned char*>(out->reserved));
  stats::Count(stats::Counter::kHandlesExported);
  VMMIPC_LOG_DEBUG("exported 0x{:x} (chunk 0x{:x}+0x{:x}, region 0x{:x}, generation {})", address,
                   chunk.base, chunk.size, region_base, chunk.generation);
  return CUDA_SUCCESS;
}

}  // namespace vmmipc::core
