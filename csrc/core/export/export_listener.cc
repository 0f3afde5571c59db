// The listener's wiring: its options from the configuration and this
// process's identity, the callbacks it reaches the export side through
// (serving a request, a lagging follower's resume fd, the counters), and the
// line that says the process exports.
#include "core/export/export_listener.h"

#include <optional>
#include <string>

#include "common/log.h"
#include "common/syscall.h"
#include "config/params.h"
#include "core/export/exported_fds.h"
#include "core/export/serve_request.h"
#include "core/fd_cache_limit.h"
#include "core/real.h"
#include "core/stats.h"

namespace vmmipc::core {
namespace {

// Worker threads of the listener, started as needed: they send replies longer
// than one message and export ahead of requests (its own thread reads
// requests and answers short ones).
constexpr int kListenerWorkers = 4;

}  // namespace

std::unique_ptr<transport::Listener> StartListener(const Identity& self, ExportSide& exporter,
                                                   void** context) {
  if (!self.has_secret) {
    // The export side remembers it (as a listener that cannot start): one line.
    VMMIPC_LOG_ERROR(
        "no randomness for this process's handle secret (getrandom: {}; /dev/urandom: {}); "
        "VMM memory cannot be exported from this process (cuIpcGetMemHandle returns "
        "CUDA_ERROR_OPERATING_SYSTEM); opening other processes' handles works",
        ErrnoText(self.no_secret.getrandom_error), ErrnoText(self.no_secret.urandom_error));
    return nullptr;
  }
  CUcontext current = nullptr;
  if (VMMIPC_REAL(CtxGetCurrent, &current) == CUDA_SUCCESS) *context = current;
  const config::Params& params = config::Get();
  transport::ListenerOptions options;
  options.secret = self.secret;
  options.pid = self.pid;
  options.instance = self.instance;  // names the socket: unique across pid namespaces
  options.socket_dir = params.socket_dir;
  options.timeout = params.timeout();
  options.max_workers = kListenerWorkers;
  options.keep_watchers = params.follow;
  // A lagging follower's catch-up resume: the memory mapped at `base` now,
  // if it is still the generation the follower missed (on the listener's thread).
  options.resume_fd = [](uint64_t base, uint32_t generation) {
    ExportSide& exporter = Exporter();
    UseExportContext(exporter);
    ScopedFd fd;
    const std::optional<ledger::VmmMapping> mapping = exporter.mappings().Find(base);
    if (!mapping || mapping->base != base || mapping->generation != generation ||
        !mapping->posix_fd_exportable || FdForChunk(exporter, *mapping, &fd) != CUDA_SUCCESS)
      return ScopedFd();
    return fd;
  };
  // Refusals the transport makes itself (uid, MAC, malformed) never reach
  // Serve: count every refusal, grant and drop where it is sent.
  options.events.refused = [](transport::RefuseReason reason) { stats::CountRefusal(reason); };
  options.events.granted = [](size_t chunks) { stats::Count(stats::Counter::kFdsSent, chunks); };
  options.events.dropped = [] { stats::Count(stats::Counter::kConnectionsDropped); };
  options.events.reaped = [] { stats::Count(stats::Counter::kConnectionsReaped); };
  exporter.mappings().SetFdCacheLimit(FdCacheLimit(params.export_fd_cache));
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
  if (self.rank >= 0)
    VMMIPC_LOG_INFO("vmmipc {} exporting: rank {} (from {}), listening on {}",
                    VMMIPC_VERSION_STRING, self.rank, params.rank_source, listener->address());
  else
    VMMIPC_LOG_INFO(
        "vmmipc {} exporting: no rank variable, {}, listening on {}", VMMIPC_VERSION_STRING,
        params.slot_from_gpu() ? "slots from the GPU"
                               : fmt::format("unranked (VMMIPC_RANK_FROM={})", params.rank_from),
        listener->address());
  return listener;
}

}  // namespace vmmipc::core
