// The open's fetch step: the run from its exporter, what a failed fetch or
// a refusal returns, and the check that the answer is the handle's run.
#include "config/params.h"
#include "core/ahead.h"
#include "core/handle_fields.h"
#include "core/import/followed_open.h"
#include "core/import/opening.h"
#include "core/real.h"
#include "core/stats.h"
#include "driver/status.h"

namespace vmmipc::core {
namespace {

// What cuIpcOpenMemHandle returns for a failed fetch and for an exporter's
// refusal. The names of both enums come from their lists (transport/client/fetch_client.h,
// transport/chunk_grant.h), their counters from core/stats.h; transport knows no
// CUresult, so these two switches are the one hand-written mapping. Every
// declared value is listed (no default) and a missing one fails the build.
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wswitch"
CUresult CodeForRefusal(transport::RefuseReason reason) {
  using transport::RefuseReason;
  switch (reason) {
    case RefuseReason::kBadToken:
    case RefuseReason::kFreed:
    case RefuseReason::kNotExported:
      return CUDA_ERROR_INVALID_HANDLE;  // the handle no longer names memory there
    case RefuseReason::kWrongUser:
      return CUDA_ERROR_NOT_PERMITTED;
    case RefuseReason::kNone:
    case RefuseReason::kExportFailed:
    case RefuseReason::kTooManyChunks:
    case RefuseReason::kInternal:
    case RefuseReason::kBadRequest:
      return CUDA_ERROR_MAP_FAILED;
  }
  return CUDA_ERROR_MAP_FAILED;  // a reason from the wire that this build does not declare
}

CUresult CodeForFetch(const transport::FetchResult& fetched) {
  using transport::FetchStatus;
  switch (fetched.status) {
    case FetchStatus::kOk:
      return CUDA_SUCCESS;
    case FetchStatus::kNoExporter:
      return CUDA_ERROR_INVALID_HANDLE;
    case FetchStatus::kUnauthentic:
      return CUDA_ERROR_NOT_PERMITTED;
    case FetchStatus::kNoResources:
      return CUDA_ERROR_OPERATING_SYSTEM;
    case FetchStatus::kTimeout:
    case FetchStatus::kProtocolError:
      return CUDA_ERROR_MAP_FAILED;
    case FetchStatus::kRefused:
      return CodeForRefusal(fetched.refuse);
  }
  return CUDA_ERROR_MAP_FAILED;
}
#pragma GCC diagnostic pop

CUresult FetchFailure(const transport::FetchResult& fetched, const ledger::Vmm2Handle& h) {
  stats::CountFetchFailure(fetched.status);
  const CUresult code = CodeForFetch(fetched);
  if (code == CUDA_SUCCESS) return code;
  OpenWarning(log::Level::kWarn, "cuIpcOpenMemHandle(pid {}, 0x{:x}): {}; returning {}", h.pid,
              h.address,
              fetched.detail.empty() ? transport::FetchStatusName(fetched.status) : fetched.detail,
              driver::ErrorName(code));
  return code;
}

// The exporter's answer must describe a run that starts at the handle's chunk
// and is contiguous; anything else is refused before mapping.
bool RunIsConsistent(const std::vector<transport::ChunkGrant>& chunks,
                     const ledger::Vmm2Handle& h) {
  if (chunks.empty() || chunks[0].address != h.chunk_base || chunks[0].size != h.chunk_size)
    return false;
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i].size == 0 || !chunks[i].fd.valid()) return false;
    if (chunks[i].address + chunks[i].size < chunks[i].address) return false;  // wraps
    if (i > 0 && chunks[i].address != chunks[i - 1].address + chunks[i - 1].size) return false;
  }
  return true;
}

}  // namespace

CUresult FetchRun(FollowedOpen& followed, Opening* open) {
  const ledger::Vmm2Handle& h = open->handle;
  const auto fetch_start = SteadyClock::now();
  const config::Params& params = config::Get();
  // A version 3 handle's exporter listens under its instance; a version 2
  // one (an older vmmipc) under its pid.
  const uint32_t instance = h.version >= 3 ? h.instance : 0;
  const transport::FetchRequest request{FieldsOf(h), h.capability, instance};
  // With follow on, the first open of an exporter's handle keeps its
  // connection for the exporter's pause and resume events.
  transport::ClientOptions options{params.socket_dir, params.timeout(), followed.watch(),
                                   followed.follower(),
                                   static_cast<size_t>(params.warm_connections)};
  // Ahead: the watch connection this fetch asks for also carries the
  // exporter's announcements of the handles it hands out.
  options.announce = followed.watch() && AheadOn();
  open->fetched = transport::FetchChunks(request, options);
  if (open->fetched.status != transport::FetchStatus::kOk) return FetchFailure(open->fetched, h);
  stats::Count(stats::Counter::kFdsReceived, open->fetched.chunks.size());
  if (!RunIsConsistent(open->fetched.chunks, h)) {
    stats::Count(stats::Counter::kOpenFailedProtocol);
    OpenWarning(log::Level::kWarn,
                "cuIpcOpenMemHandle: exporter pid {} answered with a run that does not "
                "match the handle (chunk 0x{:x}+0x{:x})",
                h.pid, h.chunk_base, h.chunk_size);
    return CUDA_ERROR_MAP_FAILED;
  }
  open->fetch_us = MicrosSince(fetch_start);
  return CUDA_SUCCESS;
}

}  // namespace vmmipc::core
