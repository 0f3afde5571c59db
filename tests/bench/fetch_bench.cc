// vmmipc_fetch_bench: the fd fetch alone (docs/benchmarks.md, "The fetch
// alone"), no driver: what an open spends getting a chunk's fd from its
// exporter, beside the least a round trip of one fd costs. An exporter
// process stands in for a vmmipc exporter: a transport::Listener whose
// handler grants one 2 MiB memfd (a dup, as the exported-fd cache hands
// out), and a bare server on a connected socketpair. Three modes, alternated
// in every round, each timed per fetch on the importer's thread:
//   floor  the bare SOCK_SEQPACKET round trip on a connected pair: an 80-byte
//          request, a 56-byte answer carrying the fd (SCM_RIGHTS), the
//          server blocked in recv: the floor of any fetch on a kept connection
//   warm   transport::FetchChunks on a kept connection (warm_connections.h)
//   cold   transport::FetchChunks on a new connection per fetch (socket,
//          connect, accept, both credential checks, request, reply)
// Prints, per mode, the median over rounds of each round's p50 and p90, and
// the ratios to the floor measured in the same run. CPU only: it runs on the
// build machine and on a GPU host alike (scripts/gpu_check's fetch step).
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/scoped_fd.h"
#include "transport/client/fetch_client.h"
#include "transport/client/warm_connections.h"
#include "transport/serve/listener/listener.h"
#include "transport/socket_io.h"
#include "transport/wire.h"

namespace {

using vmmipc::ScopedFd;
namespace transport = vmmipc::transport;
namespace wire = vmmipc::transport::wire;
using Clock = std::chrono::steady_clock;

constexpr vmmipc::transport::SipKey kSecret{0x6265'6e63'6866'6574ULL, 0x0123'4567'89ab'cdefULL};
constexpr uint64_t kBase = 0x7f1200000000ULL;
constexpr uint64_t kChunk = 2ULL << 20;

struct Options {
  int rounds = 15;
  int fetches = 200;  // per mode and round
  std::string json;   // where to write the summary as JSON ("" none)
};

bool ParseOptions(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      const std::string prefix = std::string(name) + "=";
      return arg.rfind(prefix, 0) == 0 ? argv[i] + prefix.size() : nullptr;
    };
    if (const char* v = value("--rounds")) {
      o->rounds = std::atoi(v);
    } else if (const char* v = value("--fetches")) {
      o->fetches = std::atoi(v);
    } else if (const char* v = value("--json")) {
      o->json = v;
    } else {
      std::fprintf(stderr, "vmmipc_fetch_bench: unknown argument '%s'\n", argv[i]);
      return false;
    }
  }
  if (o->rounds < 1 || o->fetches < 1) {
    std::fprintf(stderr, "vmmipc_fetch_bench: --rounds and --fetches must be at least 1\n");
    return false;
  }
  return true;
}

wire::HandleFields Handle(uint32_t pid) {
  wire::HandleFields h;
  h.exporter_pid = pid;
  h.address = kBase;
  h.chunk_base = kBase;
  h.chunk_size = kChunk;
  h.region_base = kBase;
  h.generation = 7;
  return h;
}

// The exporter process: the listener, and the bare server on `floor_fd`.
[[noreturn]] void RunExporter(int floor_fd, int ready_fd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  ScopedFd chunk(memfd_create("vmmipc-fetch-bench", MFD_CLOEXEC));
  if (!chunk || ftruncate(chunk.get(), kChunk) != 0) _exit(3);
  transport::ListenerOptions options;
  options.secret = kSecret;
  options.pid = static_cast<uint32_t>(getpid());
  options.timeout = vmmipc::Timeout::Ms(5000);
  const int chunk_fd = chunk.get();
  std::string error;
  auto listener = transport::Listener::Start(
      options,
      [chunk_fd](const transport::ServeRequest&) {
        transport::ServeReply reply;
        transport::ChunkGrant grant;
        grant.address = kBase;
        grant.size = kChunk;
        grant.generation = 7;
        grant.fd = ScopedFd(fcntl(chunk_fd, F_DUPFD_CLOEXEC, 0));
        reply.chunks.push_back(std::move(grant));
        return reply;
      },
      &error);
  if (!listener) {
    std::fprintf(stderr, "vmmipc_fetch_bench: exporter: %s\n", error.c_str());
    _exit(4);
  }
  const char ready = 'r';
  if (write(ready_fd, &ready, 1) != 1) _exit(5);
  // The floor's server: blocked in recv, answers each request with the fd.
  uint8_t request[wire::kRequestSize];
  uint8_t answer[wire::kReplyHeaderSize + wire::kReplyEntrySize] = {};
  const int fds[] = {chunk_fd};
  while (true) {
    const ssize_t n = recv(floor_fd, request, sizeof(request), 0);
    if (n <= 0) _exit(0);
    if (!transport::SendMessage(floor_fd, answer, fds, transport::Deadline::AfterMs(5000)).ok())
      _exit(6);
  }
}

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

double Median(std::vector<double> v) { return Percentile(std::move(v), 0.5); }

struct Mode {
  const char* name;
  std::vector<double> p50s;  // one per round
  std::vector<double> p90s;
};

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (!ParseOptions(argc, argv, &options)) return 2;
  int floor_pair[2];
  int ready_pipe[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, floor_pair) != 0 ||
      pipe2(ready_pipe, O_CLOEXEC) != 0) {
    std::perror("vmmipc_fetch_bench: socketpair/pipe");
    return 1;
  }
  const pid_t exporter = fork();
  if (exporter < 0) {
    std::perror("vmmipc_fetch_bench: fork");
    return 1;
  }
  if (exporter == 0) {
    close(floor_pair[0]);
    close(ready_pipe[0]);
    RunExporter(floor_pair[1], ready_pipe[1]);
  }
  close(floor_pair[1]);
  close(ready_pipe[1]);
  ScopedFd floor_fd(floor_pair[0]);
  char ready = 0;
  if (read(ready_pipe[0], &ready, 1) != 1) {
    std::fprintf(stderr, "vmmipc_fetch_bench: the exporter did not start\n");
    return 1;
  }
  close(ready_pipe[0]);

  transport::FetchRequest request;
  request.handle = Handle(static_cast<uint32_t>(exporter));
  request.capability = wire::Capability(kSecret, request.handle);
  transport::ClientOptions cold;
  cold.timeout = vmmipc::Timeout::Ms(5000);
  transport::ClientOptions warm = cold;
  warm.warm_connections = 64;

  bool failed = false;
  // Warm fetches that went on a new connection after all: the exporter keeps
  // at most kMaxKeptPerPeer connections of one process, and counts the cold
  // mode's until it has seen each one's hang-up, so a warm reply can find
  // no room and its next fetch connects again. Counted, and a run where most
  // warm fetches were not warm fails (the warm mode would not be measured).
  size_t warm_went_cold = 0;
  size_t warm_fetches = 0;
  auto fetch = [&](const transport::ClientOptions& client) {
    const auto start = Clock::now();
    transport::FetchResult r = transport::FetchChunks(request, client);
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    if (r.status != transport::FetchStatus::kOk || r.chunks.size() != 1 ||
        (client.warm_connections == 0 && r.warm)) {
      std::fprintf(stderr, "vmmipc_fetch_bench: fetch failed: %s (warm %d)\n", r.detail.c_str(),
                   r.warm ? 1 : 0);
      failed = true;
    }
    if (client.warm_connections > 0) {
      ++warm_fetches;
      if (!r.warm) ++warm_went_cold;
    }
    return us;
  };
  auto floor = [&] {
    uint8_t bytes[wire::kRequestSize] = {};
    const auto start = Clock::now();
    transport::ReceivedMessage message;
    uint8_t answer[wire::kMaxReplySize];
    const auto deadline = transport::Deadline::AfterMs(5000);
    if (!transport::SendMessage(floor_fd.get(), bytes, {}, deadline).ok() ||
        !transport::ReceiveMessage(floor_fd.get(), answer, &message, deadline).ok() ||
        message.fds.size() != 1) {
      std::fprintf(stderr, "vmmipc_fetch_bench: the floor's round trip failed\n");
      failed = true;
    }
    message.fds.clear();  // the fd closed, as a fetch's caller closes what it does not keep
    return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  };

  // One warm-up fetch of each kind: the first connection, page faults.
  floor();
  fetch(warm);
  fetch(cold);
  Mode modes[] = {{"floor", {}, {}}, {"warm", {}, {}}, {"cold", {}, {}}};
  std::vector<double> times(static_cast<size_t>(options.fetches));
  for (int round = 0; round < options.rounds && !failed; ++round) {
    for (Mode& mode : modes) {
      for (double& t : times) {
        if (mode.name[0] == 'f') {
          t = floor();
        } else {
          t = fetch(mode.name[0] == 'w' ? warm : cold);
        }
      }
      mode.p50s.push_back(Percentile(times, 0.5));
      mode.p90s.push_back(Percentile(times, 0.9));
    }
  }
  floor_fd.Reset();
  kill(exporter, SIGKILL);
  waitpid(exporter, nullptr, 0);
  warm_went_cold -= warm_fetches > 0 ? 1 : 0;  // the warm-up's first fetch makes the kept one
  if (warm_went_cold * 10 > warm_fetches) {
    std::fprintf(stderr, "vmmipc_fetch_bench: %zu of %zu warm fetches were not warm\n",
                 warm_went_cold, warm_fetches);
    failed = true;
  }
  if (failed) return 1;

  const double floor_p50 = Median(modes[0].p50s);
  std::printf("vmmipc_fetch_bench: %d rounds x %d fetches per mode, alternated; one 2 MiB memfd\n",
              options.rounds, options.fetches);
  std::printf("%-6s %9s %9s %10s\n", "mode", "p50_us", "p90_us", "p50/floor");
  std::string json = "{";
  for (const Mode& mode : modes) {
    const double p50 = Median(mode.p50s);
    const double p90 = Median(mode.p90s);
    std::printf("%-6s %9.1f %9.1f %10.2f\n", mode.name, p50, p90, p50 / floor_p50);
    json += std::string(json.size() > 1 ? ", " : "") + "\"" + mode.name +
            "\": {\"p50_us\": " + std::to_string(p50) + ", \"p90_us\": " + std::to_string(p90) +
            "}";
  }
  json += ", \"rounds\": " + std::to_string(options.rounds) +
          ", \"fetches\": " + std::to_string(options.fetches) + "}\n";
  std::printf("vmmipc_fetch_bench: warm/cold p50 %.2f\n",
              Median(modes[1].p50s) / Median(modes[2].p50s));
  const transport::WarmConnectionStats stats = transport::WarmConnectionStatsNow();
  std::printf(
      "vmmipc_fetch_bench: warm connections reused %zu, given up %zu; warm fetches on a new "
      "connection %zu of %zu\n",
      stats.reused, stats.discarded, warm_went_cold, warm_fetches);
  if (!options.json.empty()) {
    FILE* f = std::fopen(options.json.c_str(), "w");
    if (f == nullptr || std::fputs(json.c_str(), f) < 0 || std::fclose(f) != 0) {
      std::perror("vmmipc_fetch_bench: --json");
      return 1;
    }
  }
  return 0;
}
