// The counters behind VMMIPC_STATS: a zero-initialised array of atomics
// (constant-initialised, so nothing runs at load time) and the exit report.
#include "core/stats.h"

#include <atomic>
#include <cstdlib>
#include <iterator>
#include <mutex>
#include <string_view>

#include "common/log.h"
#include "config/params.h"
#include "transport/chunk_grant.h"
#include "transport/client/fetch_client.h"

namespace vmmipc::core::stats {
namespace {

constexpr int kCounterCount = static_cast<int>(Counter::kCount);

std::atomic<uint64_t> g_counters[kCounterCount];  // zero: constant initialisation
std::atomic<bool> g_exit_report_registered{false};

constexpr const char* kNames[] = {
#define VMMIPC_STATS_NAME(id, name) name,
#define VMMIPC_STATS_NAME_MAPPED(from, id, name) name,
    VMMIPC_STATS_COUNTERS(VMMIPC_STATS_NAME)
#undef VMMIPC_STATS_NAME
#undef VMMIPC_STATS_NAME_MAPPED
};
static_assert(sizeof(kNames) / sizeof(kNames[0]) == kCounterCount);

// The counters of the two mapped lists (stats.h), in list order: the
// report's refusals and the first of its open failures come from here, so a
// counter added to a list is in the report without a change here.
constexpr Counter kRefusalCounters[] = {
#define VMMIPC_STATS_REFUSAL_COUNTER(from, id, name) Counter::id,
    VMMIPC_STATS_REFUSALS(VMMIPC_STATS_REFUSAL_COUNTER)
#undef VMMIPC_STATS_REFUSAL_COUNTER
};
constexpr Counter kFetchCounters[] = {
#define VMMIPC_STATS_FETCH_COUNTER(from, id, name) Counter::id,
    VMMIPC_STATS_FETCH_FAILURES(VMMIPC_STATS_FETCH_COUNTER)
#undef VMMIPC_STATS_FETCH_COUNTER
};
constexpr Counter kFirstRefusal = kRefusalCounters[0];
constexpr Counter kLastRefusal = kRefusalCounters[std::size(kRefusalCounters) - 1];
constexpr Counter kFirstFetchFailure = kFetchCounters[0];

bool Valid(Counter counter) {
  const int index = static_cast<int>(counter);
  return index >= 0 && index < kCounterCount;
}

// "name=value" for every counter in [first, last], space separated; with
// `only_nonzero`, zero counters are skipped and "none" stands for all zero.
std::string Group(Counter first, Counter last, bool only_nonzero) {
  std::string out;
  for (int i = static_cast<int>(first); i <= static_cast<int>(last); ++i) {
    const uint64_t value = g_counters[i].load(std::memory_order_relaxed);
    if (only_nonzero && value == 0) continue;
    if (!out.empty()) out += ' ';
    out += fmt::format("{}={}", kNames[i], value);
  }
  return out.empty() ? std::string("none") : out;
}

// Whether any counter in [first, last] is non-zero.
bool Any(Counter first, Counter last) {
  for (int i = static_cast<int>(first); i <= static_cast<int>(last); ++i)
    if (g_counters[i].load(std::memory_order_relaxed) != 0) return true;
  return false;
}

void ExitHandler() { WriteReport(); }

}  // namespace

void Count(Counter counter, uint64_t n) noexcept {
  if (!Valid(counter)) return;
  g_counters[static_cast<int>(counter)].fetch_add(n, std::memory_order_relaxed);
}

uint64_t Get(Counter counter) noexcept {
  if (!Valid(counter)) return 0;
  return g_counters[static_cast<int>(counter)].load(std::memory_order_relaxed);
}

const char* Name(Counter counter) noexcept {
  return Valid(counter) ? kNames[static_cast<int>(counter)] : "unknown";
}

// Every value transport declares has a case (no default): one missing from
// the lists in stats.h fails the build.
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wswitch"
void CountFetchFailure(transport::FetchStatus status) noexcept {
  switch (status) {
    case transport::FetchStatus::kOk:
      return;
#define VMMIPC_STATS_COUNT_FETCH(from, id, name) \
  case transport::FetchStatus::from:             \
    Count(Counter::id);                          \
    return;
      VMMIPC_STATS_FETCH_FAILURES(VMMIPC_STATS_COUNT_FETCH)
#undef VMMIPC_STATS_COUNT_FETCH
  }
  Count(Counter::kOpenFailedProtocol);  // not a declared status: a bug, counted somewhere
}

void CountRefusal(transport::RefuseReason reason) noexcept {
  switch (reason) {
    case transport::RefuseReason::kNone:
      return;
#define VMMIPC_STATS_COUNT_REFUSAL(from, id, name) \
  case transport::RefuseReason::from:              \
    Count(Counter::id);                            \
    return;
      VMMIPC_STATS_REFUSALS(VMMIPC_STATS_COUNT_REFUSAL)
#undef VMMIPC_STATS_COUNT_REFUSAL
  }
  Count(Counter::kRefusedInternal);  // a reason from the wire that no build declares
}
#pragma GCC diagnostic pop

std::string Format() {
  // A section where nothing happened says "none": an importer-only process
  // shows no row of export zeros, and a reader sees at once which side ran.
  std::string out = fmt::format("vmmipc {} stats at exit:\n", VMMIPC_VERSION_STRING);
  out += "  export: " +
         (Any(Counter::kHandlesExported, Counter::kExportRefusedOther)
              ? Group(Counter::kHandlesExported, Counter::kExportRefusedOther, false)
              : std::string("none")) +
         "\n";
  out += "  listener: " +
         (Any(Counter::kRequestsServed, Counter::kConnectionsReaped)
              ? Group(Counter::kRequestsServed, Counter::kFdsSent, false) + " " +
                    Group(Counter::kConnectionsDropped, Counter::kConnectionsReaped, false) +
                    "; refusals: " + Group(kFirstRefusal, kLastRefusal, true)
              : std::string("none")) +
         "\n";
  out += "  import: " +
         (Any(Counter::kHandlesOpened, Counter::kPlacementsBestEffort)
              ? Group(Counter::kHandlesOpened, Counter::kPlacementsBestEffort, false) +
                    fmt::format(" (mapped {}, unmapped {})", log::Bytes(Get(Counter::kBytesMapped)),
                                log::Bytes(Get(Counter::kBytesUnmapped)))
              : std::string("none")) +
         "\n";
  // Only where a close left a page-table anchor (VMMIPC_ZONE_ANCHORS).
  if (Any(Counter::kZoneAnchorsMapped, Counter::kZoneAnchorsDropped))
    out += "  zone anchors: " +
           Group(Counter::kZoneAnchorsMapped, Counter::kZoneAnchorsDropped, false) + "\n";
  // Only where follow did something (VMMIPC_FOLLOW=1 and a pause or resume).
  if (Any(Counter::kFollowNotices, Counter::kUnfollowedBytes))
    out += "  follow: " + Group(Counter::kFollowNotices, Counter::kUnfollowedBytes, false) + "\n";
  // Only where ahead did something (VMMIPC_AHEAD=1 with follow).
  if (Any(Counter::kAnnouncementsSent, Counter::kOpensAheadDropped))
    out +=
        "  ahead: " + Group(Counter::kAnnouncementsSent, Counter::kOpensAheadDropped, false) + "\n";
  // Only where the background export did something (VMMIPC_BACKGROUND_EXPORT=1).
  if (Any(Counter::kBackgroundExports, Counter::kBackgroundLeftToGet))
    out += "  background export: " +
           Group(Counter::kBackgroundExports, Counter::kBackgroundLeftToGet, false) + "\n";
  out += "  open failures: " + Group(kFirstFetchFailure, Counter::kOpenFailedInvalid, true);
  return out;
}

void WriteReport() noexcept {
  try {
    const std::string report = Format();
    std::string_view rest(report);
    while (!rest.empty()) {
      const size_t end = rest.find('\n');
      // kInfo through Write (not Log): shown whatever VMMIPC_LOG_LEVEL says,
      // since VMMIPC_STATS=1 asked for it.
      log::Write(log::Level::kInfo, rest.substr(0, end));
      if (end == std::string_view::npos) break;
      rest.remove_prefix(end + 1);
    }
  } catch (...) {
    // Never let a report take the exiting process down.
  }
}

void EnableExitReport() noexcept {
  if (g_exit_report_registered.exchange(true, std::memory_order_acq_rel)) return;
  if (std::atexit(ExitHandler) != 0) g_exit_report_registered.store(false);
}

void EnableExitReportIfConfigured() noexcept {
  if (g_exit_report_registered.load(std::memory_order_acquire)) return;
  try {
    if (config::Get().stats) EnableExitReport();
  } catch (...) {
  }
}

void ResetAfterFork() noexcept { ResetForTesting(); }

void ResetForTesting() noexcept {
  for (auto& counter : g_counters) counter.store(0, std::memory_order_relaxed);
}

}  // namespace vmmipc::core::stats
