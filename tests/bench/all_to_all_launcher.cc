// The launcher of vmmipc_all_to_all: parses the command line, starts the N
// rank processes (this binary again, VMMIPC_RANK=i, GPU i % G), drives every
// configuration through them as a framework's registration would (allocate,
// get, all-gather, barrier, open everything, check, barrier, close, free),
// times the registration as it sees it, and writes the table and the JSON.
// It never initialises CUDA: a framework's launcher does not either, and a
// context here would be one more on the GPU than the ranks account for.
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "all_to_all.h"
#include "bench_common.h"

extern char** environ;

namespace vmmipc_all_to_all {
namespace {

using vmmipc_bench::kMiB;
using vmmipc_bench::NowNs;

constexpr uint64_t kGranularity = 2 * kMiB;  // VMM allocation granularity of current GPUs
constexpr int kMaxRanks = 64;

// The counters of vmmipc's VMMIPC_STATS report that this benchmark sums over the ranks.
// fds_exported and fd_cache_grants come with the per-chunk fd cache; older libraries do not
// print them, and a missing counter is reported as n/a.
const char* const kCounters[] = {"requests_served", "chunks_served", "fds_sent", "fds_exported",
                                 "fd_cache_grants"};

// ---- options ---------------------------------------------------------------------------------

struct Options {
  int ranks = 2;
  int gpus = 1;
  int reps = 3;
  std::vector<uint64_t> buffers = {8};
  std::vector<uint64_t> chunk_sizes = {2 * kMiB};
  std::vector<uint64_t> chunks = {1};
  std::string json;
  double timeout_s = 120;
  double budget_s = 0;  // 0: no budget
  bool warmup = true;
  double gap_s = 0;    // between a phase's allocation and its gets (untimed)
  bool floor = false;  // also the driver's floor (Kind::kFloor) in every configuration
  bool corrupt_tag = false;
  bool count_gpus = false;
};

constexpr const char* kUsage =
    "usage: vmmipc_all_to_all [--ranks N] [--gpus G] [--per-rank-buffers K[,K...]]\n"
    "                         [--chunk-size S[,S...]] [--chunks-per-buffer C[,C...]] [--reps R]\n"
    "                         [--json PATH] [--timeout-s T] [--budget-s B] [--no-warmup]\n"
    "                         [--floor] [--gap-ms MS]\n"
    "       vmmipc_all_to_all --count-gpus\n"
    "All-to-all registration of N rank processes (this binary again, VMMIPC_RANK=i, GPU i % G):\n"
    "each rank allocates K buffers of C chunks of S bytes, VMM (cuMemCreate + cuMemMap) and\n"
    "legacy (cuMemAlloc) in the same run, gets a handle of each, the handles are all-gathered\n"
    "through this launcher, and every rank opens every peer's handles. Lists of K, S and C run\n"
    "one after the other with the same rank processes. S takes B, KiB, MiB, GiB (or K, M, G)\n"
    "and must be a multiple of 2 MiB. Defaults: --ranks 2 --gpus 1 --per-rank-buffers 8\n"
    "--chunk-size 2MiB --chunks-per-buffer 1 --reps 3 --timeout-s 120 (every wait for a rank).\n"
    "--budget-s B: start no repetition after B seconds (the rest is reported as not run).\n"
    "--floor: also the driver's floor on the same VMM buffers: each chunk's fd exported and\n"
    "kept by its rank, copied by the importer with pidfd_getfd (untimed; needs ptrace rights\n"
    "over the peer ranks, else reported as unsupported), then import + map + access timed.\n"
    "--gap-ms MS: wait MS milliseconds between each phase's allocation and its gets (an\n"
    "application that registers memory it allocated a while before; default 0).\n"
    "Each kind's first phase in the rank processes (the warm-up when there is one; with\n"
    "--no-warmup the first configuration's first repetition) is a process's first\n"
    "registration: reported apart ('first'), never in the medians.\n"
    "--count-gpus: print the number of GPUs a child process sees, and exit.\n"
    "Preload vmmipc (LD_PRELOAD) to measure VMM memory; without it the VMM part is reported as\n"
    "unsupported. Exit: 0 done, 1 a failure (wrong data, a call that must work failed, a rank\n"
    "died or hung), 2 bad arguments. docs/benchmarks.md describes the output.\n";

[[noreturn]] void BadArgs(const std::string& message) {
  std::fprintf(stderr, "vmmipc_all_to_all: %s\n%s", message.c_str(), kUsage);
  std::exit(2);
}

bool ParseUint(const std::string& text, uint64_t* out) {
  if (text.empty() || text.size() > 18) return false;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  *out = v;
  return true;
}

// "2MiB", "20M", "2097152", "1GiB" -> bytes.
bool ParseSize(const std::string& text, uint64_t* out) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  uint64_t v = 0;
  if (!ParseUint(text.substr(0, digits), &v)) return false;
  const std::string unit = text.substr(digits);
  uint64_t scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  if (unit == "K" || unit == "KiB") scale = 1ull << 10;
  if (unit == "M" || unit == "MiB") scale = 1ull << 20;
  if (unit == "G" || unit == "GiB") scale = 1ull << 30;
  if (scale == 0 || v > (1ull << 44) / scale) return false;
  *out = v * scale;
  return true;
}

std::vector<std::string> SplitCommas(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(',', start);
    out.push_back(text.substr(start, comma - start));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

std::vector<uint64_t> ParseList(const std::string& flag, const std::string& text, bool size,
                                uint64_t min, uint64_t max) {
  std::vector<uint64_t> out;
  for (const std::string& item : SplitCommas(text)) {
    uint64_t v = 0;
    if (!(size ? ParseSize(item, &v) : ParseUint(item, &v)) || v < min || v > max) {
      BadArgs(flag + ": '" + item + "' is not " +
              (size ? "a size such as 2MiB or 20MiB"
                    : "an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]"));
    }
    out.push_back(v);
  }
  return out;
}

int ParseInt(const std::string& flag, const std::string& text, int min, int max) {
  uint64_t v = 0;
  if (!ParseUint(text, &v) || v < static_cast<uint64_t>(min) || v > static_cast<uint64_t>(max))
    BadArgs(flag + ": '" + text + "' is not an integer in [" + std::to_string(min) + ", " +
            std::to_string(max) + "]");
  return static_cast<int>(v);
}

double ParseSeconds(const std::string& flag, const std::string& text, bool zero_ok) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(v) || v < 0 || (!zero_ok && v == 0))
    BadArgs(flag + ": '" + text + "' is not a " + (zero_ok ? "non-negative" : "positive") +
            " number of seconds");
  return v;
}

Options ParseOptions(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i], value;
    const size_t eq = arg.find('=');
    const bool has_value = arg.rfind("--", 0) == 0 && eq != std::string::npos;
    if (has_value) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    auto take = [&]() -> std::string {
      if (has_value) return value;
      if (i + 1 >= argc) BadArgs(arg + " needs a value");
      return argv[++i];
    };
    auto no_value = [&]() {
      if (has_value) BadArgs(arg + " takes no value");
    };
    if (arg == "--ranks") {
      o.ranks = ParseInt(arg, take(), 2, kMaxRanks);
    } else if (arg == "--gpus") {
      o.gpus = ParseInt(arg, take(), 1, kMaxRanks);
    } else if (arg == "--reps") {
      o.reps = ParseInt(arg, take(), 1, 1000);
    } else if (arg == "--per-rank-buffers") {
      o.buffers = ParseList(arg, take(), false, 1, 100000);
    } else if (arg == "--chunk-size") {
      o.chunk_sizes = ParseList(arg, take(), true, 1, 1ull << 44);
    } else if (arg == "--chunks-per-buffer") {
      o.chunks = ParseList(arg, take(), false, 1, 4096);
    } else if (arg == "--json") {
      o.json = take();
      if (o.json.empty()) BadArgs("--json needs a path");
    } else if (arg == "--timeout-s") {
      o.timeout_s = ParseSeconds(arg, take(), false);
    } else if (arg == "--budget-s") {
      o.budget_s = ParseSeconds(arg, take(), true);
    } else if (arg == "--no-warmup") {
      no_value();
      o.warmup = false;
    } else if (arg == "--gap-ms") {
      o.gap_s = ParseSeconds(arg, take(), true) * 1e-3;
    } else if (arg == "--floor") {
      no_value();
      o.floor = true;
    } else if (arg == "--count-gpus") {
      no_value();
      o.count_gpus = true;
    } else if (arg == "--test-corrupt-tag") {
      // Test only: rank 0 writes a wrong tag, so that the check must fail (exit 1).
      no_value();
      o.corrupt_tag = true;
    } else if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      BadArgs("unknown argument '" + std::string(argv[i]) + "'");
    }
  }
  for (uint64_t s : o.chunk_sizes) {
    if (s % kGranularity != 0)
      BadArgs("--chunk-size: " + std::to_string(s) +
              " bytes is not a multiple of 2 MiB (the VMM allocation granularity)");
  }
  if (o.gpus > o.ranks) BadArgs("--gpus must not exceed --ranks");
  return o;
}

// ---- results ---------------------------------------------------------------------------------

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
  rank = std::clamp<size_t>(rank, 1, v.size());
  return v[rank - 1];  // nearest rank
}

double MedianOf(const std::vector<double>& v) { return v.empty() ? NAN : Percentile(v, 0.5); }

struct RepResult {
  double total_us = NAN;  // barrier release to the last rank's open reply, launcher clock
  // The whole registration: the gets' command sent to the last rank's open reply (gets,
  // the handles' all-gather through the launcher, the opens), launcher clock.
  double registration_us = NAN;
  double open_p50_us = NAN, open_p99_us = NAN, get_p50_us = NAN, close_p50_us = NAN;
  size_t opens = 0;
};

struct KindResult {
  std::string status = "not run";  // ok, unsupported, failed, not run
  std::string error;
  std::vector<RepResult> reps;
  // The rank processes' first phase of this kind, when it was this configuration's: a
  // process's first registration, kept out of the medians.
  bool has_first = false;
  RepResult first;

  double Median(double RepResult::*field) const {
    std::vector<double> v;
    for (const RepResult& r : reps)
      if (!std::isnan(r.*field)) v.push_back(r.*field);
    return MedianOf(v);
  }
};

struct Config {
  uint64_t buffers = 0, chunk_size = 0, chunks = 0;
  KindResult kinds[kKinds];  // by Kind
  int reps_planned = 0;

  uint64_t BufferBytes() const { return chunk_size * chunks; }
};

std::string SizeText(uint64_t bytes) {
  char text[32];
  if (bytes % (1ull << 30) == 0) {
    std::snprintf(text, sizeof(text), "%llu GiB", static_cast<unsigned long long>(bytes >> 30));
  } else {
    std::snprintf(text, sizeof(text), "%llu MiB", static_cast<unsigned long long>(bytes >> 20));
  }
  return text;
}

// ---- JSON ------------------------------------------------------------------------------------

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string Num(double v) {
  if (std::isnan(v) || std::isinf(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.3f", v);
  return buf;
}

// ---- the launcher ----------------------------------------------------------------------------

std::atomic<pid_t> g_rank_pids[kMaxRanks];

void OnSignal(int sig) {
  for (auto& p : g_rank_pids) {
    const pid_t pid = p.load();
    if (pid > 0) kill(pid, SIGKILL);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

struct RankProc {
  pid_t pid = -1;
  int fd = -1;         // the launcher's end of the socketpair
  int stderr_fd = -1;  // a memfd that is the rank's stderr
  std::map<std::string, std::string> hello;
};

class Launcher {
 public:
  Launcher(const Options& o, std::string self, std::string command)
      : o_(o), self_(std::move(self)), command_(std::move(command)) {
    nonce_ = (static_cast<uint64_t>(getpid()) << 32) ^ static_cast<uint64_t>(NowNs());
    for (uint64_t s : o_.chunk_sizes)
      for (uint64_t c : o_.chunks)
        for (uint64_t k : o_.buffers) {
          Config cfg;
          cfg.buffers = k;
          cfg.chunk_size = s;
          cfg.chunks = c;
          cfg.reps_planned = o_.reps;
          configs_.push_back(cfg);
        }
  }

  int Run() {
    start_ns_ = NowNs();
    std::string error;
    if (!Start(&error)) return Finish("start: " + error);
    PrintHeader();
    if (o_.warmup) {
      Config warm;
      warm.buffers = 1;
      warm.chunk_size = o_.chunk_sizes[0];
      warm.chunks = 1;
      warm.reps_planned = 1;
      for (Kind kind : Kinds()) {
        if (!RunPhase(&warm, kWarmupConfig, 0, kind, &error)) return Finish(error);
      }
      warmup_ = warm;
      PrintWarmup();
    }
    for (size_t i = 0; i < configs_.size(); ++i) {
      Config& cfg = configs_[i];
      for (int rep = 0; rep < o_.reps; ++rep) {
        if (o_.budget_s > 0 && static_cast<double>(NowNs() - start_ns_) * 1e-9 > o_.budget_s) {
          budget_cut_ = true;
          break;
        }
        // Rotate which kind goes first, so that none always runs on a warmer GPU.
        const std::vector<Kind> kinds = Kinds();
        for (size_t j = 0; j < kinds.size(); ++j) {
          const Kind kind = kinds[(j + static_cast<size_t>(rep)) % kinds.size()];
          if (!RunPhase(&cfg, static_cast<uint32_t>(i), static_cast<uint32_t>(rep), kind, &error))
            return Finish(error);
        }
      }
      PrintRow(cfg);
      PrintFirst(cfg);
      WriteJson();
    }
    return Finish("");
  }

 private:
  std::vector<Kind> Kinds() const {
    if (o_.floor) return {Kind::kLegacy, Kind::kVmm, Kind::kFloor};
    return {Kind::kLegacy, Kind::kVmm};
  }

  // ---- processes ----

  bool Start(std::string* error) {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      if (entry.rfind("VMMIPC_RANK=", 0) == 0 || entry.rfind("VMMIPC_STATS=", 0) == 0) continue;
      env.push_back(entry);
    }
    env.push_back("VMMIPC_STATS=1");  // the counters at exit: exports, grants, requests
    ranks_.resize(o_.ranks);
    for (int i = 0; i < o_.ranks; ++i) {
      RankProc& r = ranks_[i];
      int sv[2];
      if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        *error = std::string("socketpair: ") + std::strerror(errno);
        return false;
      }
      // Above 3, so that dup2 onto fd 3 in the child always clears CLOEXEC.
      const int child_end = fcntl(sv[1], F_DUPFD_CLOEXEC, 10);
      close(sv[1]);
      r.fd = sv[0];
      // The rank's stderr: a memfd, read after it exits (the VMMIPC_STATS report is there).
      const std::string name = "vmmipc_all_to_all.rank" + std::to_string(i) + ".stderr";
      r.stderr_fd = memfd_create(name.c_str(), MFD_CLOEXEC);
      if (child_end < 0 || r.stderr_fd < 0) {
        if (child_end >= 0) close(child_end);
        *error = std::string("fcntl / memfd_create: ") + std::strerror(errno);
        return false;
      }
      std::vector<std::string> args = {self_,
                                       "--vmmipc_rank_child",
                                       "--rank=" + std::to_string(i),
                                       "--device=" + std::to_string(i % o_.gpus),
                                       "--gpus=" + std::to_string(o_.gpus),
                                       "--parent=" + std::to_string(getpid())};
      std::vector<std::string> rank_env = env;
      rank_env.push_back("VMMIPC_RANK=" + std::to_string(i));
      std::vector<char*> argv, envp;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      for (auto& e : rank_env) envp.push_back(e.data());
      envp.push_back(nullptr);
      posix_spawn_file_actions_t actions;
      posix_spawn_file_actions_init(&actions);
      posix_spawn_file_actions_adddup2(&actions, child_end, kChannelFd);
      posix_spawn_file_actions_adddup2(&actions, r.stderr_fd, STDERR_FILENO);
      posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
      const int rc =
          posix_spawn(&r.pid, self_.c_str(), &actions, nullptr, argv.data(), envp.data());
      posix_spawn_file_actions_destroy(&actions);
      close(child_end);
      if (rc != 0) {
        r.pid = -1;
        *error = "posix_spawn of rank " + std::to_string(i) + ": " + std::strerror(rc);
        return false;
      }
      g_rank_pids[i].store(r.pid);
    }
    // Hello: every rank has its context (cuInit and context creation of N processes).
    std::vector<Reply> replies;
    Command hello;
    hello.cmd = static_cast<uint32_t>(Cmd::kHello);
    if (!Broadcast(hello, {}, &replies, nullptr, error)) return false;
    std::string failures;
    for (int i = 0; i < o_.ranks; ++i) {
      if (replies[i].head.status != 0) failures += std::string(replies[i].head.text) + "; ";
      std::string text = replies[i].head.text;
      size_t start = 0;
      while (start < text.size()) {
        size_t end = text.find('\n', start);
        if (end == std::string::npos) end = text.size();
        const std::string line = text.substr(start, end - start);
        const size_t eq = line.find('=');
        if (eq != std::string::npos) ranks_[i].hello[line.substr(0, eq)] = line.substr(eq + 1);
        start = end + 1;
      }
    }
    if (!failures.empty()) {
      *error = "rank start-up failed: " + failures;
      return false;
    }
    ready_ns_ = NowNs();
    return true;
  }

  // Sends `c` to every rank, then waits (bounded) for every reply. *last_ns: when the last
  // reply was read. False only when the channel broke (a rank died or hung): fatal.
  bool Broadcast(const Command& c, const std::vector<CUipcMemHandle>& handles,
                 std::vector<Reply>* replies, int64_t* last_ns, std::string* error) {
    for (int i = 0; i < o_.ranks; ++i) {
      if (!SendCommand(ranks_[i].fd, c, handles, error)) {
        *error = "to rank " + std::to_string(i) + ": " + *error;
        return false;
      }
    }
    replies->assign(o_.ranks, Reply());
    std::vector<bool> done(o_.ranks, false);
    int left = o_.ranks;
    const int64_t deadline = NowNs() + static_cast<int64_t>(o_.timeout_s * 1e9);
    while (left > 0) {
      std::vector<pollfd> fds;
      std::vector<int> which;
      for (int i = 0; i < o_.ranks; ++i) {
        if (done[i]) continue;
        fds.push_back({ranks_[i].fd, POLLIN, 0});
        which.push_back(i);
      }
      const int64_t wait_ms = (deadline - NowNs()) / 1000000;
      if (wait_ms <= 0) {
        *error = "no reply within " + Num(o_.timeout_s) + " s (--timeout-s) to command " +
                 std::to_string(c.cmd) + " from rank(s)";
        for (int i : which) *error += " " + std::to_string(i);
        return false;
      }
      const int r = poll(fds.data(), fds.size(), static_cast<int>(wait_ms));
      if (r < 0 && errno != EINTR) {
        *error = std::string("poll: ") + std::strerror(errno);
        return false;
      }
      for (size_t j = 0; r > 0 && j < fds.size(); ++j) {
        if (fds[j].revents == 0) continue;
        const int i = which[j];
        uint32_t type = 0;
        std::string payload;
        const int64_t ms_left = std::max<int64_t>(1, (deadline - NowNs()) / 1000000);
        if (!ReceiveFrame(ranks_[i].fd, &type, &payload, static_cast<int>(ms_left), error) ||
            !ParseReply(payload, &(*replies)[i], error)) {
          *error = "from rank " + std::to_string(i) + ": " + *error;
          return false;
        }
        if (last_ns != nullptr) *last_ns = NowNs();
        done[i] = true;
        --left;
      }
    }
    return true;
  }

  // ---- one phase: one kind, one repetition of one configuration ----

  // False only on a fatal error (the channel broke). A failed or refused phase is recorded
  // in `cfg` and the run goes on.
  bool RunPhase(Config* cfg, uint32_t config_index, uint32_t rep, Kind kind, std::string* error) {
    KindResult& result = cfg->kinds[static_cast<int>(kind)];
    const int k = static_cast<int>(kind);
    if (result.status == "unsupported" || unsupported_[k]) {
      result.status = "unsupported";
      if (result.error.empty()) result.error = unsupported_reason_[k];
      return true;
    }
    Command c;
    c.kind = static_cast<uint32_t>(kind);
    c.config = config_index;
    c.rep = rep;
    c.buffers = cfg->buffers;
    c.chunk_size = cfg->chunk_size;
    c.chunks = cfg->chunks;
    c.nonce = nonce_;
    c.corrupt_tag = o_.corrupt_tag ? 1 : 0;
    std::vector<Reply> replies;
    RepResult rr;
    std::vector<double> gets, opens, closes;
    std::string phase_error;
    bool unsupported = false;

    auto step = [&](Cmd cmd, const std::vector<CUipcMemHandle>& handles, int64_t* last_ns,
                    std::vector<double>* samples) -> bool {
      c.cmd = static_cast<uint32_t>(cmd);
      if (!Broadcast(c, handles, &replies, last_ns, error)) return false;
      int refused = 0;
      for (const Reply& r : replies) {
        if (samples != nullptr) samples->insert(samples->end(), r.samples.begin(), r.samples.end());
        if (r.head.status == static_cast<int32_t>(Status::kUnsupported)) ++refused;
        if (r.head.status != 0 && phase_error.empty()) phase_error = r.head.text;
      }
      // Unsupported only when every rank says so: one rank alone refusing is a failure.
      if (refused == o_.ranks) unsupported = true;
      return true;
    };

    if (!step(Cmd::kAlloc, {}, nullptr, nullptr)) return false;
    // The gap between allocation and registration (an application that registers memory
    // it allocated a while before): what was mapped may be exported meanwhile.
    if (phase_error.empty() && o_.gap_s > 0) {
      const int64_t gap_ns = static_cast<int64_t>(o_.gap_s * 1e9);
      timespec ts{static_cast<time_t>(gap_ns / 1000000000), static_cast<long>(gap_ns % 1000000000)};
      while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
      }
    }
    const int64_t registration_start = NowNs();
    if (phase_error.empty() && !step(Cmd::kGet, {}, nullptr, &gets)) return false;
    std::vector<CUipcMemHandle> all;
    if (phase_error.empty()) {
      for (const Reply& r : replies) {
        if (r.handles.size() != cfg->buffers) {
          phase_error = "a rank sent " + std::to_string(r.handles.size()) + " handles, not " +
                        std::to_string(cfg->buffers);
          break;
        }
        all.insert(all.end(), r.handles.begin(), r.handles.end());
      }
    }
    if (phase_error.empty()) {
      if (!step(Cmd::kHandles, all, nullptr, nullptr)) return false;
    }
    if (phase_error.empty()) {
      // The barrier is released now: every rank holds every handle and waits for this.
      const int64_t t0 = NowNs();
      int64_t t1 = t0;
      if (!step(Cmd::kOpen, {}, &t1, &opens)) return false;
      rr.total_us = static_cast<double>(t1 - t0) * 1e-3;
      rr.registration_us = static_cast<double>(t1 - registration_start) * 1e-3;
      if (kind == Kind::kVmm) {
        const uint64_t n = static_cast<uint64_t>(o_.ranks);
        vmm_chunks_ += n * cfg->buffers * cfg->chunks;
        vmm_grants_ += n * (n - 1) * cfg->buffers * cfg->chunks;
        vmm_opens_ += n * (n - 1) * cfg->buffers;
      }
      const bool opened_ok = phase_error.empty();
      if (!step(Cmd::kCheck, {}, nullptr, nullptr)) return false;
      if (!opened_ok || !phase_error.empty()) rr.total_us = rr.registration_us = NAN;
      if (!step(Cmd::kClose, {}, nullptr, &closes)) return false;
    }
    // Always: nothing of this phase may stay allocated or open.
    const std::string before_free = phase_error;
    if (!step(Cmd::kFree, {}, nullptr, nullptr)) return false;
    if (phase_error.empty() && !before_free.empty()) phase_error = before_free;

    if (unsupported && kind != Kind::kLegacy) {
      result.status = "unsupported";
      result.error = phase_error;
      unsupported_[k] = true;
      unsupported_reason_[k] = phase_error;
      return true;
    }
    if (!phase_error.empty()) {
      result.status = "failed";
      if (result.error.empty()) result.error = phase_error;
      failures_.push_back(
          std::string(KindName(kind)) + " " + Describe(*cfg) +
          (config_index == kWarmupConfig ? " warm-up" : " rep " + std::to_string(rep)) + ": " +
          phase_error);
      std::fprintf(stderr, "vmmipc_all_to_all: FAILED: %s\n", failures_.back().c_str());
      return true;
    }
    rr.opens = opens.size();
    const size_t expected = static_cast<size_t>(o_.ranks) * (o_.ranks - 1) * cfg->buffers;
    if (rr.opens != expected) {
      result.status = "failed";
      result.error =
          "counted " + std::to_string(rr.opens) + " opens, expected " + std::to_string(expected);
      failures_.push_back(result.error);
      return true;
    }
    rr.open_p50_us = MedianOf(opens) * 1e6;
    rr.open_p99_us = Percentile(opens, 0.99) * 1e6;
    rr.get_p50_us = MedianOf(gets) * 1e6;
    rr.close_p50_us = MedianOf(closes) * 1e6;
    if (result.status != "failed") result.status = "ok";
    // A process's first registration of this kind: apart, never in a configuration's
    // medians (the warm-up keeps its one repetition too, as its own row shows it).
    if (!first_seen_[k]) {
      first_seen_[k] = true;
      result.has_first = true;
      result.first = rr;
      if (config_index != kWarmupConfig) return true;
    }
    result.reps.push_back(rr);
    return true;
  }

  std::string Describe(const Config& cfg) const {
    return "N=" + std::to_string(o_.ranks) + " G=" + std::to_string(o_.gpus) +
           " K=" + std::to_string(cfg.buffers) + " chunk " + SizeText(cfg.chunk_size) + " x " +
           std::to_string(cfg.chunks);
  }

  // ---- the end: quit, stderr, counters ----

  int Finish(const std::string& fatal) {
    if (!fatal.empty()) {
      failures_.push_back("fatal: " + fatal);
      std::fprintf(stderr, "vmmipc_all_to_all: FATAL: %s\n", fatal.c_str());
    }
    std::string error;
    std::vector<Reply> replies;
    if (fatal.empty() && !ranks_.empty()) {
      Command quit;
      quit.cmd = static_cast<uint32_t>(Cmd::kQuit);
      if (!Broadcast(quit, {}, &replies, nullptr, &error)) {
        failures_.push_back("quit: " + error);
        std::fprintf(stderr, "vmmipc_all_to_all: quit: %s\n", error.c_str());
      }
    }
    // Ranks that quit exit on their own (and write the stats report); the rest are killed.
    // Context teardown of a rank with many mappings takes a while on a GPU: wait as for a reply.
    const int64_t deadline =
        NowNs() + (fatal.empty() ? static_cast<int64_t>(o_.timeout_s * 1e9) : 0);
    for (size_t i = 0; i < ranks_.size(); ++i) {
      RankProc& r = ranks_[i];
      if (r.pid <= 0) continue;
      int status = 0;
      bool killed = false;
      for (;;) {
        const pid_t w = waitpid(r.pid, &status, WNOHANG);
        if (w == r.pid || (w < 0 && errno != EINTR)) break;
        if (NowNs() > deadline) {
          kill(r.pid, SIGKILL);
          waitpid(r.pid, &status, 0);
          killed = true;
          break;
        }
        usleep(5000);
      }
      g_rank_pids[i].store(-1);
      // A rank that ended on its own without exit 0 crashed (or refused to start); one killed
      // here after a fatal error is a consequence, not news.
      if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) && (!killed || fatal.empty())) {
        failures_.push_back("rank " + std::to_string(i) +
                            (WIFSIGNALED(status)
                                 ? " died of signal " + std::to_string(WTERMSIG(status))
                                 : " exited with status " + std::to_string(WEXITSTATUS(status))) +
                            (killed ? " (killed: it did not exit after quit)" : ""));
      }
    }
    ReadRankStderr();
    PrintCounters();
    WriteJson();
    if (!failures_.empty()) {
      std::printf("\nFAILED: %zu problem(s); first: %s\n", failures_.size(),
                  failures_.front().c_str());
    }
    std::fflush(stdout);
    return failures_.empty() ? 0 : 1;
  }

  // Forwards every rank's stderr (prefixed) to ours and sums the counters of its
  // VMMIPC_STATS report: "name=value" pairs (or "name value", "name: value") after the
  // last "stats at exit" line.
  void ReadRankStderr() {
    for (size_t i = 0; i < ranks_.size(); ++i) {
      RankProc& r = ranks_[i];
      if (r.stderr_fd < 0) continue;
      std::string text;
      char buf[65536];
      off_t offset = 0;
      ssize_t n;
      while ((n = pread(r.stderr_fd, buf, sizeof(buf), offset)) > 0) {
        text.append(buf, static_cast<size_t>(n));
        offset += n;
      }
      close(r.stderr_fd);
      r.stderr_fd = -1;
      size_t start = 0;
      while (start < text.size()) {
        size_t end = text.find('\n', start);
        if (end == std::string::npos) end = text.size();
        std::fprintf(stderr, "[rank %zu] %s\n", i, text.substr(start, end - start).c_str());
        start = end + 1;
      }
      const size_t report = text.rfind("stats at exit");
      if (report == std::string::npos) continue;
      ++ranks_reporting_;
      std::vector<std::string> tokens;
      std::string token;
      for (char ch : text.substr(report) + " ") {
        if (ch == ' ' || ch == '\n' || ch == '\t' || ch == ',' || ch == ';' || ch == '(' ||
            ch == ')' || ch == '|') {
          if (!token.empty()) tokens.push_back(token);
          token.clear();
        } else {
          token += ch;
        }
      }
      for (size_t t = 0; t < tokens.size(); ++t) {
        std::string name = tokens[t], value;
        const size_t eq = name.find_first_of("=:");
        if (eq != std::string::npos) {
          value = name.substr(eq + 1);
          name = name.substr(0, eq);
        }
        if (value.empty() && t + 1 < tokens.size()) value = tokens[t + 1];
        uint64_t v = 0;
        if (!ParseUint(value, &v)) continue;
        for (const char* counter : kCounters) {
          if (name == counter) counters_[name] += v;
        }
      }
    }
  }

  // ---- output ----

  std::string Hello(int rank, const std::string& key) const {
    if (rank >= static_cast<int>(ranks_.size())) return "?";
    auto it = ranks_[rank].hello.find(key);
    return it == ranks_[rank].hello.end() ? "?" : it->second;
  }

  bool Simulated() const {
    return Hello(0, "device").find("vmmipc simulated device") != std::string::npos;
  }

  std::string VmmipcInRanks() const {
    int yes = 0;
    for (int i = 0; i < static_cast<int>(ranks_.size()); ++i) yes += Hello(i, "hooks") == "yes";
    if (yes == static_cast<int>(ranks_.size())) return "yes";
    return yes == 0 ? "no" : "in " + std::to_string(yes) + " of " + std::to_string(ranks_.size());
  }

  void PrintHeader() {
    std::printf(
        "vmmipc_all_to_all: %d ranks on %d GPU(s) (rank i on GPU i %% %d), %d reps; "
        "medians over reps\n",
        o_.ranks, o_.gpus, o_.gpus, o_.reps);
    std::printf(
        "device: %s; driver API %s; vmmipc in the ranks: %s; ranks ready in %.0f ms%s\n",
        Hello(0, "device").c_str(), Hello(0, "driver_version").c_str(), VmmipcInRanks().c_str(),
        static_cast<double>(ready_ns_ - start_ns_) * 1e-6,
        Simulated() ? "\nSIMULATED DRIVER: host memory, the numbers say nothing about a GPU" : "");
    std::printf(
        "total: barrier release to the last rank's reply after opening all (N-1) x K "
        "peer handles, launcher clock.\nopen/get: per call, over all ranks' calls.\n\n");
    std::printf(
        "%5s %8s %4s | %-32s | %-32s | %s%s\n", "K", "chunk", "C",
        "legacy: total ms, open p50/p99 us", "vmmipc: total ms, open p50/p99 us",
        "vmmipc/legacy: total, open p50; get us legacy/vmmipc",
        o_.floor ? " || floor: total ms, open p50/p99 us | vmmipc/floor, floor/legacy: total" : "");
    std::fflush(stdout);
  }

  static std::string Cell(const KindResult& k) {
    char text[96];
    if (k.status == "ok") {
      std::snprintf(text, sizeof(text), "%9.2f  %8.1f / %8.1f",
                    k.Median(&RepResult::total_us) * 1e-3, k.Median(&RepResult::open_p50_us),
                    k.Median(&RepResult::open_p99_us));
      return text;
    }
    return k.status;
  }

  void PrintRow(const Config& cfg) {
    const KindResult& l = cfg.kinds[0];
    const KindResult& v = cfg.kinds[1];
    char ratios[128] = "-";
    if (l.status == "ok" && v.status == "ok") {
      std::snprintf(ratios, sizeof(ratios), "%6.2fx %6.2fx; %.2f / %.2f",
                    v.Median(&RepResult::total_us) / l.Median(&RepResult::total_us),
                    v.Median(&RepResult::open_p50_us) / l.Median(&RepResult::open_p50_us),
                    l.Median(&RepResult::get_p50_us), v.Median(&RepResult::get_p50_us));
    }
    std::printf("%5llu %8s %4llu | %-32s | %-32s | %s%s%s\n",
                static_cast<unsigned long long>(cfg.buffers), SizeText(cfg.chunk_size).c_str(),
                static_cast<unsigned long long>(cfg.chunks), Cell(l).c_str(), Cell(v).c_str(),
                ratios, FloorCells(cfg).c_str(),
                l.reps.size() + l.has_first < static_cast<size_t>(cfg.reps_planned) ||
                        (v.status == "ok" &&
                         v.reps.size() + v.has_first < static_cast<size_t>(cfg.reps_planned))
                    ? " (fewer reps: budget or failure)"
                    : "");
    std::fflush(stdout);
  }

  // A process's first registration (gets, all-gather, opens), of each kind whose first phase
  // this configuration ran, beside the later ones' median, with the ratios of the same run.
  void PrintFirst(const Config& cfg) const {
    bool any = false;
    for (const KindResult& k : cfg.kinds) any = any || k.has_first;
    if (!any) return;
    std::string line = "      registration (gets + all-gather + opens), gap " +
                       Num(o_.gap_s * 1e3) + " ms, first / later ms:";
    for (Kind kind : Kinds()) {
      const KindResult& k = cfg.kinds[static_cast<int>(kind)];
      line += std::string(" ") + KindName(kind) + " " +
              (k.has_first ? Num(k.first.registration_us * 1e-3) : std::string("-")) + " / " +
              Num(k.Median(&RepResult::registration_us) * 1e-3);
    }
    const KindResult& l = cfg.kinds[static_cast<int>(Kind::kLegacy)];
    const KindResult& v = cfg.kinds[static_cast<int>(Kind::kVmm)];
    const KindResult& f = cfg.kinds[static_cast<int>(Kind::kFloor)];
    auto ratio = [](const KindResult& a, const KindResult& b, bool first) -> std::string {
      const double x = first ? (a.has_first ? a.first.registration_us : NAN)
                             : a.Median(&RepResult::registration_us);
      const double y = first ? (b.has_first ? b.first.registration_us : NAN)
                             : b.Median(&RepResult::registration_us);
      return std::isnan(x) || std::isnan(y) || y == 0 ? "-" : Num(x / y) + "x";
    };
    line += "; vmmipc/legacy " + ratio(v, l, true) + " / " + ratio(v, l, false);
    if (o_.floor)
      line += ", vmmipc/floor " + ratio(v, f, true) + " / " + ratio(v, f, false) +
              ", floor/legacy " + ratio(f, l, true) + " / " + ratio(f, l, false);
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }

  // The floor's cell and its ratios, after the row's own (empty without --floor).
  std::string FloorCells(const Config& cfg) const {
    if (!o_.floor) return "";
    const KindResult& l = cfg.kinds[static_cast<int>(Kind::kLegacy)];
    const KindResult& v = cfg.kinds[static_cast<int>(Kind::kVmm)];
    const KindResult& f = cfg.kinds[static_cast<int>(Kind::kFloor)];
    std::string out = " || " + Cell(f);
    if (f.status != "ok") return out;
    char text[64];
    std::snprintf(text, sizeof(text), " | %s %s", RatioText(v, f).c_str(), RatioText(f, l).c_str());
    return out + text;
  }

  static std::string RatioText(const KindResult& a, const KindResult& b) {
    if (a.status != "ok" || b.status != "ok") return "-";
    char text[32];
    std::snprintf(text, sizeof(text), "%.2fx",
                  a.Median(&RepResult::total_us) / b.Median(&RepResult::total_us));
    return text;
  }

  void PrintWarmup() {
    std::printf(
        "%5s %8s %4s | %-32s | %-32s | (warm-up: first registration in these processes, "
        "not in the medians)\n",
        "1", SizeText(warmup_.chunk_size).c_str(), "1", Cell(warmup_.kinds[0]).c_str(),
        Cell(warmup_.kinds[1]).c_str());
    std::fflush(stdout);
  }

  std::string Counter(const std::string& name) const {
    auto it = counters_.find(name);
    return it == counters_.end() ? "n/a" : std::to_string(it->second);
  }

  // One export per chunk: the verdict on whether a second importer of a chunk made the
  // exporter export again.
  std::string ExportVerdict() const {
    auto it = counters_.find("fds_exported");
    if (vmm_chunks_ == 0) return "n/a (no VMM registration ran)";
    if (it == counters_.end()) return "n/a (this vmmipc does not report fds_exported)";
    if (o_.ranks == 2) {
      return it->second == vmm_chunks_
                 ? "n/a (N=2: one importer per chunk); one export per chunk"
                 : "n/a (N=2: one importer per chunk); " + std::to_string(it->second) +
                       " exports for " + std::to_string(vmm_chunks_) + " chunks";
    }
    if (it->second == vmm_chunks_) return "yes: one export per chunk";
    return "no: " + std::to_string(it->second) + " exports for " + std::to_string(vmm_chunks_) +
           " chunks";
  }

  void PrintCounters() {
    std::printf(
        "\nvmmipc counters (VMMIPC_STATS=1 in the ranks; summed over %d of %zu ranks, "
        "whole run including the warm-up):",
        ranks_reporting_, ranks_.size());
    for (const char* c : kCounters) std::printf(" %s %s", c, Counter(c).c_str());
    std::printf(
        "\nVMM registration in this run: %llu chunks exported to peers, %llu chunk "
        "grants (opens x chunks), %llu opens; with one export per chunk and a dup for "
        "every later grant: fds_exported %llu, fd_cache_grants %llu\n",
        static_cast<unsigned long long>(vmm_chunks_), static_cast<unsigned long long>(vmm_grants_),
        static_cast<unsigned long long>(vmm_opens_), static_cast<unsigned long long>(vmm_chunks_),
        static_cast<unsigned long long>(vmm_grants_ - vmm_chunks_));
    std::printf("second importer of a chunk caused no export: %s\n", ExportVerdict().c_str());
    if (budget_cut_)
      std::printf("budget: --budget-s %.0f s spent, later repetitions not run\n", o_.budget_s);
  }

  std::string KindJson(const KindResult& k) const {
    std::string s = "{\"status\": " + Quote(k.status) + ", \"error\": " + Quote(k.error) +
                    ", \"reps_run\": " + std::to_string(k.reps.size());
    s += ", \"total_us\": " + Num(k.Median(&RepResult::total_us));
    s += ", \"open_p50_us\": " + Num(k.Median(&RepResult::open_p50_us));
    s += ", \"open_p99_us\": " + Num(k.Median(&RepResult::open_p99_us));
    s += ", \"get_p50_us\": " + Num(k.Median(&RepResult::get_p50_us));
    s += ", \"close_p50_us\": " + Num(k.Median(&RepResult::close_p50_us));
    s += ", \"registration_us\": " + Num(k.Median(&RepResult::registration_us));
    s += ", \"first\": " + (k.has_first
                                ? "{\"total_us\": " + Num(k.first.total_us) +
                                      ", \"registration_us\": " + Num(k.first.registration_us) +
                                      ", \"open_p50_us\": " + Num(k.first.open_p50_us) +
                                      ", \"get_p50_us\": " + Num(k.first.get_p50_us) + "}"
                                : std::string("null"));
    s += ", \"reps\": [";
    for (size_t i = 0; i < k.reps.size(); ++i) {
      const RepResult& r = k.reps[i];
      s += std::string(i ? ", " : "") + "{\"total_us\": " + Num(r.total_us) +
           ", \"registration_us\": " + Num(r.registration_us) +
           ", \"open_p50_us\": " + Num(r.open_p50_us) + ", \"open_p99_us\": " + Num(r.open_p99_us) +
           ", \"get_p50_us\": " + Num(r.get_p50_us) + ", \"close_p50_us\": " + Num(r.close_p50_us) +
           ", \"opens\": " + std::to_string(r.opens) + "}";
    }
    return s + "]}";
  }

  std::string ConfigJson(const Config& cfg) const {
    const KindResult& l = cfg.kinds[0];
    const KindResult& v = cfg.kinds[1];
    const bool both = l.status == "ok" && v.status == "ok";
    std::string s =
        "{\"ranks\": " + std::to_string(o_.ranks) + ", \"gpus\": " + std::to_string(o_.gpus) +
        ", \"per_rank_buffers\": " + std::to_string(cfg.buffers) +
        ", \"chunk_size\": " + std::to_string(cfg.chunk_size) +
        ", \"chunks_per_buffer\": " + std::to_string(cfg.chunks) +
        ", \"buffer_bytes\": " + std::to_string(cfg.BufferBytes()) +
        ", \"reps_planned\": " + std::to_string(cfg.reps_planned) + ", \"opens_per_rep\": " +
        std::to_string(static_cast<uint64_t>(o_.ranks) * (o_.ranks - 1) * cfg.buffers);
    s += ", \"legacy\": " + KindJson(l) + ", \"vmmipc\": " + KindJson(v);
    if (o_.floor) {
      const KindResult& f = cfg.kinds[static_cast<int>(Kind::kFloor)];
      const bool floor_ok = f.status == "ok";
      s += ", \"floor\": " + KindJson(f);
      s += ", \"ratio_vmmipc_floor_total\": " +
           Num(floor_ok && v.status == "ok"
                   ? v.Median(&RepResult::total_us) / f.Median(&RepResult::total_us)
                   : NAN);
      s += ", \"ratio_floor_legacy_total\": " +
           Num(floor_ok && l.status == "ok"
                   ? f.Median(&RepResult::total_us) / l.Median(&RepResult::total_us)
                   : NAN);
    }
    s += ", \"ratio_total\": " +
         Num(both ? v.Median(&RepResult::total_us) / l.Median(&RepResult::total_us) : NAN);
    s += ", \"ratio_open_p50\": " +
         Num(both ? v.Median(&RepResult::open_p50_us) / l.Median(&RepResult::open_p50_us) : NAN);
    return s + "}";
  }

  void WriteJson() {
    if (o_.json.empty()) return;
    char date[64] = "?";
    const time_t now = time(nullptr);
    struct tm tm_utc;
    if (gmtime_r(&now, &tm_utc) != nullptr)
      std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", &tm_utc);
    char host[256] = "?";
    gethostname(host, sizeof(host) - 1);
    const char* preload = std::getenv("LD_PRELOAD");
    std::string s = "{\n  \"tool\": \"vmmipc_all_to_all\",\n  \"format\": 1,\n";
    s +=
        "  \"context\": {\"date\": " + Quote(date) + ", \"host\": " + Quote(host) +
        ", \"command\": " + Quote(command_) + ", \"ranks\": " + std::to_string(o_.ranks) +
        ", \"gpus\": " + std::to_string(o_.gpus) + ", \"reps\": " + std::to_string(o_.reps) +
        ", \"gap_ms\": " + Num(o_.gap_s * 1e3) + ", \"warmup\": " + (o_.warmup ? "true" : "false") +
        ", \"device\": " + Quote(Hello(0, "device")) +
        ", \"driver_version\": " + Quote(Hello(0, "driver_version")) +
        ", \"device_count\": " + Quote(Hello(0, "device_count")) +
        ", \"simulated\": " + (Simulated() ? "true" : "false") +
        ", \"vmmipc_in_ranks\": " + Quote(VmmipcInRanks()) +
        ", \"ld_preload\": " + Quote(preload != nullptr ? preload : "") + ", \"ranks_ready_ms\": " +
        Num(ready_ns_ > 0 ? static_cast<double>(ready_ns_ - start_ns_) * 1e-6 : NAN) +
        ", \"budget_cut\": " + (budget_cut_ ? "true" : "false") + "},\n";
    s += "  \"warmup\": " + (warmup_.buffers != 0 ? ConfigJson(warmup_) : std::string("null")) +
         ",\n  \"configurations\": [";
    for (size_t i = 0; i < configs_.size(); ++i)
      s += std::string(i ? ",\n    " : "\n    ") + ConfigJson(configs_[i]);
    s += "\n  ],\n  \"stats\": {\"ranks_reporting\": " + std::to_string(ranks_reporting_);
    for (const char* c : kCounters) {
      auto it = counters_.find(c);
      s += std::string(", ") + Quote(c) + ": " +
           (it == counters_.end() ? std::string("null") : std::to_string(it->second));
    }
    s += ", \"vmm_chunks\": " + std::to_string(vmm_chunks_) +
         ", \"vmm_chunk_grants\": " + std::to_string(vmm_grants_) +
         ", \"vmm_opens\": " + std::to_string(vmm_opens_) +
         ", \"second_importer_no_export\": " + Quote(ExportVerdict()) + "},\n";
    s += "  \"failures\": [";
    for (size_t i = 0; i < failures_.size(); ++i)
      s += std::string(i ? ", " : "") + Quote(failures_[i]);
    s += "],\n  \"ok\": " + std::string(failures_.empty() ? "true" : "false") + "\n}\n";
    // Written whole to a temporary name, then renamed: a reader never sees half a file.
    const std::string tmp = o_.json + ".tmp";
    std::FILE* f = std::fopen(tmp.c_str(), "w");
    if (f == nullptr || std::fwrite(s.data(), 1, s.size(), f) != s.size() || std::fclose(f) != 0 ||
        std::rename(tmp.c_str(), o_.json.c_str()) != 0) {
      std::fprintf(stderr, "vmmipc_all_to_all: cannot write %s: %s\n", o_.json.c_str(),
                   std::strerror(errno));
    }
  }

  const Options o_;
  const std::string self_;
  const std::string command_;
  uint64_t nonce_ = 0;
  int64_t start_ns_ = 0, ready_ns_ = 0;
  std::vector<RankProc> ranks_;
  std::vector<Config> configs_;
  Config warmup_;
  bool unsupported_[kKinds] = {};  // by Kind: every rank refused it once, the rest not run
  bool first_seen_[kKinds] = {};   // by Kind: its first phase in these processes has run
  std::string unsupported_reason_[kKinds];
  bool budget_cut_ = false;
  std::vector<std::string> failures_;
  std::map<std::string, uint64_t> counters_;
  int ranks_reporting_ = 0;
  uint64_t vmm_chunks_ = 0, vmm_grants_ = 0, vmm_opens_ = 0;
};

// Runs this binary with --vmmipc_count_gpus and prints what it found.
int CountGpus(const std::string& self) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) {
    std::perror("vmmipc_all_to_all: pipe2");
    return 1;
  }
  std::string a0 = self, a1 = "--vmmipc_count_gpus";
  char* argv[] = {a0.data(), a1.data(), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, self.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  if (rc != 0) {
    close(out[0]);
    std::fprintf(stderr, "vmmipc_all_to_all: posix_spawn: %s\n", std::strerror(rc));
    return 1;
  }
  std::string text;
  char buf[256];
  ssize_t n;
  while ((n = read(out[0], buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR))
    if (n > 0) text.append(buf, static_cast<size_t>(n));
  close(out[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  int count = -1;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
      std::sscanf(text.c_str(), "gpus %d", &count) == 1) {
    std::printf("%d\n", count);
    return 0;
  }
  std::fprintf(stderr, "vmmipc_all_to_all: cannot count GPUs: %s", text.c_str());
  return 1;
}

}  // namespace

int LauncherMain(int argc, char** argv) {
  const Options o = ParseOptions(argc, argv);
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) {
    std::perror("vmmipc_all_to_all: readlink /proc/self/exe");
    return 1;
  }
  self[n] = '\0';
  if (o.count_gpus) return CountGpus(self);
  std::string command = argv[0];
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  for (auto& p : g_rank_pids) p.store(-1);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) signal(sig, OnSignal);
  Launcher launcher(o, self, command);
  return launcher.Run();
}

}  // namespace vmmipc_all_to_all
