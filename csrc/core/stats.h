// Process counters for VMMIPC_STATS=1: a fixed set of relaxed atomics that
// the export, import and listener paths bump, and one block printed in the
// log (stderr, or VMMIPC_LOG_FILE) at exit. Counting is a single atomic add
// and never allocates or logs; the exit report is registered lazily (on first
// use of the library, never at load time). This file owns the counters and the report, not the
// decisions of when to count: those live with the code that does the work.
#pragma once

#include <cstdint>
#include <string>

namespace vmmipc::transport {
enum class RefuseReason : uint16_t;  // transport/chunk_grant.h
enum class FetchStatus;              // transport/client/fetch_client.h
}  // namespace vmmipc::transport

namespace vmmipc::core::stats {

// The counters of transport's two enums, one per enumerator, in report order:
// a refusal this process's listener sent, and an open whose fetch failed.
// transport names its values; what they count as here is core's.
// X(transport enumerator, counter, "counter name"). The switches in stats.cc
// come from these lists and fail the build when transport declares a value
// that is missing here.
#define VMMIPC_STATS_REFUSALS(X)                                      \
  X(kBadToken, kRefusedBadToken, "refused_bad_token")                 \
  X(kWrongUser, kRefusedWrongUser, "refused_wrong_user")              \
  X(kNotExported, kRefusedNotExported, "refused_not_exported")        \
  X(kFreed, kRefusedFreed, "refused_freed")                           \
  X(kExportFailed, kRefusedExportFailed, "refused_export_failed")     \
  X(kTooManyChunks, kRefusedTooManyChunks, "refused_too_many_chunks") \
  X(kInternal, kRefusedInternal, "refused_internal")                  \
  X(kBadRequest, kRefusedBadRequest, "refused_bad_request")
#define VMMIPC_STATS_FETCH_FAILURES(X)                               \
  X(kNoExporter, kOpenFailedNoExporter, "open_failed_no_exporter")   \
  X(kTimeout, kOpenFailedTimeout, "open_failed_timeout")             \
  X(kRefused, kOpenFailedRefused, "open_failed_refused")             \
  X(kUnauthentic, kOpenFailedUnauthentic, "open_failed_unauthentic") \
  X(kProtocolError, kOpenFailedProtocol, "open_failed_protocol")     \
  X(kNoResources, kOpenFailedNoResources, "open_failed_no_resources")

// X(enumerator, "name in the report"). The two lists above come in through
// X_MAPPED(transport enumerator, enumerator, "name"), which every user of
// this list defines beside X (as the enum below).
#define VMMIPC_STATS_COUNTERS(X)                                \
  /* Exporter: cuIpcGetMemHandle on VMM memory. */              \
  X(kHandlesExported, "handles_exported")                       \
  X(kExportRefusedNoPosixFd, "export_refused_no_posix_fd")      \
  X(kExportRefusedNoListener, "export_refused_no_listener")     \
  X(kExportRefusedOther, "export_refused_other")                \
  /* Exporter: the listener. */                                 \
  X(kRequestsServed, "requests_served")                         \
  X(kChunksServed, "chunks_served")                             \
  X(kFdsExported, "fds_exported")                               \
  X(kFdCacheGrants, "fd_cache_grants")                          \
  X(kFdCacheEvictions, "fd_cache_evictions")                    \
  X(kExportKeepAlives, "export_keepalives")                     \
  X(kFdsSent, "fds_sent")                                       \
  VMMIPC_STATS_REFUSALS(X##_MAPPED)                             \
  X(kConnectionsDropped, "connections_dropped")                 \
  X(kConnectionsReaped, "connections_reaped")                   \
  /* Importer: cuIpcOpenMemHandle / cuIpcCloseMemHandle. */     \
  X(kHandlesOpened, "handles_opened")                           \
  X(kReopens, "reopens")                                        \
  X(kCloses, "closes")                                          \
  X(kFdsReceived, "fds_received")                               \
  X(kChunksMapped, "chunks_mapped")                             \
  X(kBytesMapped, "bytes_mapped")                               \
  X(kChunksUnmapped, "chunks_unmapped")                         \
  X(kBytesUnmapped, "bytes_unmapped")                           \
  X(kSlotCollisions, "slot_collisions")                         \
  X(kPlacementsBestEffort, "placements_best_effort")            \
  X(kZoneAnchorsMapped, "zone_anchors_mapped")                  \
  X(kZoneAnchorsMoved, "zone_anchors_moved")                    \
  X(kZoneAnchorsDropped, "zone_anchors_dropped")                \
  /* Follow (VMMIPC_FOLLOW): exporter, then importer. */        \
  X(kFollowNotices, "follow_notices")                           \
  X(kFollowUnanswered, "follow_unanswered")                     \
  X(kFollowPauses, "follow_pauses")                             \
  X(kFollowResumes, "follow_resumes")                           \
  X(kFollowResumeRefused, "follow_resume_refused")              \
  X(kUnfollowedUnmaps, "unfollowed_unmaps")                     \
  X(kUnfollowedBytes, "unfollowed_bytes")                       \
  /* Ahead (VMMIPC_AHEAD): exporter, then importer. */          \
  X(kAnnouncementsSent, "announcements_sent")                   \
  X(kAnnouncementsReceived, "announcements_received")           \
  X(kAnnouncementsDropped, "announcements_dropped")             \
  X(kOpensAhead, "opens_ahead")                                 \
  X(kOpensAdopted, "opens_adopted")                             \
  X(kOpensAheadDropped, "opens_ahead_dropped")                  \
  /* Background export (VMMIPC_BACKGROUND_EXPORT): exporter. */ \
  X(kBackgroundExports, "background_exports")                   \
  X(kBackgroundLeftToGet, "background_left_to_get")             \
  /* Importer: why an open of a VMM2 handle failed. */          \
  VMMIPC_STATS_FETCH_FAILURES(X##_MAPPED)                       \
  X(kOpenFailedMap, "open_failed_map")                          \
  X(kOpenFailedBadHandle, "open_failed_bad_handle")             \
  X(kOpenFailedInvalid, "open_failed_invalid")

enum class Counter : int {
#define VMMIPC_STATS_ENUM(id, name) id,
#define VMMIPC_STATS_ENUM_MAPPED(from, id, name) id,
  VMMIPC_STATS_COUNTERS(VMMIPC_STATS_ENUM)
#undef VMMIPC_STATS_ENUM
#undef VMMIPC_STATS_ENUM_MAPPED
      kCount
};

// Adds `n` to a counter: one relaxed atomic add, safe from any thread.
void Count(Counter counter, uint64_t n = 1) noexcept;
uint64_t Get(Counter counter) noexcept;
// The counter's name in the report, e.g. "handles_exported".
const char* Name(Counter counter) noexcept;

// Helpers for the two places where a cause arrives as an enum.
// A failed fetch (status != kOk), and with kRefused also the reason: counts
// the matching open_failed_* counter.
void CountFetchFailure(transport::FetchStatus status) noexcept;
// A refusal sent by this process's listener: counts the matching refused_*.
void CountRefusal(transport::RefuseReason reason) noexcept;

// The report: a few lines (no trailing newline, no log prefix), grouped as
// export / listener / import / failures. A section where every counter is
// zero says "none"; zero refusal and failure counters are left out.
std::string Format();

// When VMMIPC_STATS=1, registers (once per process) an atexit handler that
// writes Format() to stderr through the logger, one prefixed line each, at a
// level shown whatever VMMIPC_LOG_LEVEL says. Call from first-use paths
// (creation of the process state), never from a load-time constructor.
void EnableExitReportIfConfigured() noexcept;
// The same without looking at the configuration (tests).
void EnableExitReport() noexcept;
// Writes the report now (what the exit handler does).
void WriteReport() noexcept;

// A forked child starts from zero: its report then covers only its own work.
// The exit handler, if registered, stays registered in the child.
void ResetAfterFork() noexcept;
// Zeroes every counter (tests).
void ResetForTesting() noexcept;

}  // namespace vmmipc::core::stats
