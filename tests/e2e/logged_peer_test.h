// LoggedPeerTest: the fixture the fault and follow suites share. Its peers
// write their stderr (vmmipc's log lines) to a file each, which Log() reads
// and which is printed when a test fails; Held() is what a peer holds (its
// fds, and on the simulated driver the driver's mappings, reservations and
// allocations) to compare before and after; ExitLog() ends a peer cleanly and
// returns its log with the VMMIPC_STATS report; Settled() and Steady() wait
// for what a peer holds to stop changing. Beside it, the timing and process
// helpers those checks use.
#pragma once

#include <cuda.h>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "e2e_layout.h"
#include "peer_process.h"

namespace vmmipc::testing {

using Clock = std::chrono::steady_clock;

inline long MsSince(Clock::time_point start) {
  return static_cast<long>(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count());
}
inline bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}
// "err <code> " of a CUresult, as vmmipc_peer answers it.
inline std::string ErrPrefix(CUresult code) {
  return "err " + std::to_string(static_cast<int>(code)) + " ";
}

// Stops `pid` and waits until the kernel reports it stopped ('T' in
// /proc/<pid>/stat): kill() only queues the signal, and a loaded machine can
// let the process run on for a while.
inline bool StopAndWait(pid_t pid) {
  if (kill(pid, SIGSTOP) != 0) return false;
  for (int i = 0; i < 2000; ++i) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t paren = text.rfind(')');
    if (paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] == 'T')
      return true;
    usleep(1000);
  }
  return false;
}

// Descriptors of another process, counted from outside (no command needed,
// so it works while that process is busy or stopped).
inline int FdsOf(pid_t pid) {
  int n = 0;
  if (DIR* d = opendir(("/proc/" + std::to_string(pid) + "/fd").c_str())) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

// The fd count of another process once it has stayed the same for `quiet_ms`
// (at most `bound_ms`): what it holds for good, not what an asynchronous step
// holds for a moment (the listener closes a reply's fds and its connection
// after the importer has returned; an export ahead runs on a worker).
inline int SteadyFdsOf(pid_t pid, int quiet_ms = 300, int bound_ms = 5000) {
  int last = FdsOf(pid);
  const auto start = Clock::now();
  auto since = start;
  while (MsSince(since) < quiet_ms && MsSince(start) < bound_ms) {
    usleep(2000);
    const int now = FdsOf(pid);
    if (now != last) {
      last = now;
      since = Clock::now();
    }
  }
  return last;
}

// Whether `done()` holds within `ms`, looked at every millisecond.
template <typename Done>
bool WaitUntil(Done done, int ms = 5000) {
  const auto start = Clock::now();
  while (!done()) {
    if (MsSince(start) > ms) return false;
    usleep(1000);
  }
  return true;
}

// The fd count of another process once it has reached `expected` (at most
// `bound_ms`) and then stayed the same for `quiet_ms`: a later change (one
// export too many) still shows.
inline int SettledFdsOf(pid_t pid, int expected, int quiet_ms = 300, int bound_ms = 5000) {
  WaitUntil([&] { return FdsOf(pid) == expected; }, bound_ms);
  return SteadyFdsOf(pid, quiet_ms, bound_ms);
}

// Whether a thread of `pid` (its main thread, or with `main_thread` false
// any other) sleeps in poll: where an open waits for its exporter's answer
// once its request is sent. Read from /proc/<pid>/task/<tid>/syscall, whose
// first field is the number of the system call the thread is blocked in.
// PollingThreads counts them: vmmipc's own threads (the listener's, the
// follow thread) wait in poll too, so a test that waits for one open in poll
// compares with the count from before the open.
inline int PollingThreads(pid_t pid, bool main_thread) {
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = opendir(tasks.c_str());
  if (d == nullptr) return 0;
  int polling = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.' || (std::to_string(pid) == e->d_name) != main_thread) continue;
    std::ifstream in(tasks + "/" + e->d_name + "/syscall");
    long number = -1;
    if (!(in >> number)) continue;  // "running"
#ifdef SYS_poll
    if (number == SYS_poll) ++polling;
#endif
    if (number == SYS_ppoll) ++polling;
  }
  closedir(d);
  return polling;
}
inline bool WaitsInPoll(pid_t pid, bool main_thread) {
  return PollingThreads(pid, main_thread) > 0;
}

// How many threads of `pid` other than its main one sleep (nanosleep or
// clock_nanosleep): one more than before is where the simulator holds a
// delayed driver call (a sanitizer's own background thread sleeps always:
// compare with the count before the call).
inline int SleepingThreads(pid_t pid) {
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = opendir(tasks.c_str());
  if (d == nullptr) return 0;
  int sleeping = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.' || std::to_string(pid) == e->d_name) continue;
    std::ifstream in(tasks + "/" + e->d_name + "/syscall");
    long number = -1;
    if (!(in >> number)) continue;  // "running"
    if (number == SYS_clock_nanosleep || number == SYS_nanosleep) ++sleeping;
  }
  closedir(d);
  return sleeping;
}

// How many times `text` occurs in `log`.
inline size_t Occurrences(const std::string& log, const std::string& text) {
  size_t n = 0;
  for (size_t at = log.find(text); at != std::string::npos; at = log.find(text, at + text.size()))
    ++n;
  return n;
}

// The value of one VMMIPC_STATS counter ("name=value") in a log that holds the
// exit report; 0 when the report leaves it out (it omits zero counters).
inline uint64_t StatsCounter(const std::string& log, const std::string& name) {
  std::smatch match;
  if (!std::regex_search(log, match, std::regex("\\b" + name + "=([0-9]+)"))) return 0;
  return std::stoull(match[1].str());
}

// What a peer holds: its fds, and (simulated driver) the driver's objects.
struct Resources {
  int fds = -1;
  long mappings = -1, reservations = -1, allocations = -1;
  bool operator==(const Resources&) const = default;
};
inline std::ostream& operator<<(std::ostream& out, const Resources& r) {
  return out << "fds=" << r.fds << " mappings=" << r.mappings << " reservations=" << r.reservations
             << " allocations=" << r.allocations;
}

class LoggedPeerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!DriverAvailable(&why)) {
      GTEST_SKIP() << why;
    }
  }

  void TearDown() override {
    for (const auto& [name, path] : logs_) {
      if (HasFailure()) {
        std::ifstream in(path);
        std::cerr << "---- stderr of " << name << " ----\n" << in.rdbuf() << "\n";
      }
      std::filesystem::remove(path);
    }
  }

  static bool Sim() { return DriverUnderTest() == DriverKind::kSimulated; }

  // Variables every Peer() of the fixture gets unless the call sets them.
  // The e2e suites count what a peer holds (fds at rest, before and after a
  // failing open); warm connections are kept on purpose on both sides and
  // would be counted, so peers run without them (a new connection per open,
  // as before them) unless a test turns them on: what they do is tested in
  // Fault.WarmConnection* and unit.TransportWarm.*, and the GPU check's
  // Python checks run with the default (on).
  std::map<std::string, std::string> default_env_{{"VMMIPC_WARM_CONNECTIONS", "0"}};

  // A started and initialised peer with the given rank ("" = unranked),
  // whose stderr (vmmipc's log lines) goes to a file that Log() reads; where
  // `placement` puts it, with libvmmipc.so preloaded unless `preload` is false.
  std::unique_ptr<PeerProcess> Peer(const std::string& name, const std::string& rank,
                                    std::map<std::string, std::string> env = {},
                                    const PeerPlacement& placement = {}, bool preload = true) {
    env.emplace("VMMIPC_RANK", rank.empty() ? kUnset : rank);
    // Unranked means no slot at all, also on a host whose GPU would give one.
    if (rank.empty()) env.emplace("VMMIPC_RANK_FROM", "env");
    env.emplace("LOCAL_RANK", kUnset);
    env.emplace("RANK", kUnset);
    for (const auto& [variable, value] : default_env_) env.emplace(variable, value);
    std::string why;
    auto peer = PeerProcess::Start(env, preload, placement, &why);
    if (peer == nullptr) {
      ADD_FAILURE() << "cannot start " << name << ": " << why;
      return nullptr;
    }
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("vmmipc-e2e-" + std::to_string(getpid()) + "-" +
                               std::to_string(logs_.size()) + "-" + name + ".log"))
                                 .string();
    // A peer of no mapped uid cannot create it: made here, for it to write.
    if (placement.unmapped_user_namespace) {
      const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
      EXPECT_TRUE(fd >= 0 && fchmod(fd, 0666) == 0);
      if (fd >= 0) close(fd);
    }
    EXPECT_EQ(peer->Call("redirect_stderr " + path), "ok");
    logs_.emplace_back(name, path);
    log_of_[peer.get()] = path;
    EXPECT_EQ(peer->Call("init"), "ok");
    return peer;
  }

  std::string Log(const PeerProcess& peer) {
    std::ifstream in(log_of_[&peer]);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  // Whether `text` shows up in the peer's log within `ms` (the listener logs
  // drops when their deadline passes, after the test has moved on); with
  // `from`, only past that many bytes of the log.
  bool LogShows(const PeerProcess& peer, const std::string& text, int ms = 3000, size_t from = 0) {
    const auto start = Clock::now();
    while (Log(peer).find(text, from) == std::string::npos) {
      if (MsSince(start) > ms) return false;
      usleep(10000);
    }
    return true;
  }
  // Ends the peer with a clean exit (atexit handlers run: the VMMIPC_STATS
  // report, with VMMIPC_STATS=1) and returns its whole log.
  std::string ExitLog(std::unique_ptr<PeerProcess>* peer) {
    const std::string path = log_of_[peer->get()];
    log_of_.erase(peer->get());
    peer->reset();
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  // The peer's resources once they stop changing, or `expected` as soon as
  // they match it: a connection that may hold an unverified peer's fds is
  // closed by the importer's reaper thread, a moment after the call returned.
  Resources Settled(PeerProcess& peer, const Resources& expected) {
    Resources now = Held(peer);
    for (int i = 0; i < 200 && !(now == expected); ++i) {
      usleep(10000);
      now = Held(peer);
    }
    return now;
  }

  // The peer's resources once they have stayed the same for `quiet_ms` (at
  // most `bound_ms`): a baseline that must not catch an asynchronous step
  // midway, where the value to expect is not known beforehand.
  Resources Steady(PeerProcess& peer, int quiet_ms = 300, int bound_ms = 5000) {
    Resources last = Held(peer);
    const auto start = Clock::now();
    auto since = start;
    while (MsSince(since) < quiet_ms && MsSince(start) < bound_ms) {
      usleep(5000);
      const Resources now = Held(peer);
      if (!(now == last)) {
        last = now;
        since = Clock::now();
      }
    }
    return last;
  }

  // `chunks` 2 MiB chunks in `p`, filled with `seed`; returns the base.
  uint64_t VmmBuffer(PeerProcess& p, const std::string& name, int chunks, int seed) {
    const uint64_t base =
        Num(Value(p.Call("alloc_vmm " + name + " " + Hex(kChunk) + " " + std::to_string(chunks))));
    EXPECT_NE(base, 0u);
    EXPECT_EQ(p.Call("fill " + Hex(base) + " " + Hex(chunks * kChunk) + " " + std::to_string(seed)),
              "ok");
    return base;
  }

  std::string Handle(PeerProcess& exporter, uint64_t address) {
    const std::string hex = Value(exporter.Call("get " + Hex(address)));
    EXPECT_EQ(hex.size(), 128u);
    return hex;
  }

  // A one-chunk buffer an exporter handed out: its name there, its base, its
  // handle, and the byte it is filled with.
  struct HandedOutBuffer {
    std::string name;
    uint64_t base = 0;
    std::string handle;
    int seed = 0;
  };

  // Opens `b` in `importer` and checks its bytes; the pointer ("" on failure).
  std::string OpenChecked(PeerProcess& importer, const HandedOutBuffer& b) {
    const std::string ptr = Value(importer.Call("open " + b.handle));
    EXPECT_FALSE(ptr.empty()) << b.name;
    if (!ptr.empty()) {
      EXPECT_EQ(importer.Call("check " + ptr + " " + Hex(kChunk) + " " + std::to_string(b.seed)),
                "ok")
          << b.name;
    }
    return ptr;
  }

  Resources Held(PeerProcess& p) {
    Resources r;
    r.fds = static_cast<int>(Num(Value(p.Call("fds"))));
    const std::string stats = p.Call("stats");
    if (StartsWith(stats, "ok ")) {
      auto field = [&](const std::string& key) {
        const size_t at = stats.find(key + "=");
        return at == std::string::npos ? -1 : std::stol(stats.substr(at + key.size() + 1));
      };
      r.mappings = field("mappings");
      r.reservations = field("reservations");
      r.allocations = field("allocations");
    }
    return r;
  }

  // The simulated driver's `nth` next `function` call in `peer` fails with
  // `code` (vmmipc_peer's `inject`).
  static bool Inject(PeerProcess& peer, const std::string& function, int nth, CUresult code) {
    return peer.Call("inject " + function + " " + std::to_string(nth) + " " +
                     std::to_string(static_cast<int>(code))) == "ok";
  }

  // `r` once `anchors` page-table anchors (VMMIPC_ZONE_ANCHORS) are left
  // where there were none: a mapping each, and the one allocation they share
  // (with an fd on the simulated driver, which backs memory with a memfd).
  static Resources WithAnchors(Resources r, int anchors) {
    if (anchors <= 0) return r;
    if (r.mappings >= 0) r.mappings += anchors;
    if (r.allocations >= 0) r.allocations += 1;
    if (Sim() && r.fds >= 0) r.fds += 1;
    return r;
  }

  // Opens `handle` in `importer`, checks `size` bytes of pattern `seed` and
  // closes it: makes the importer's lazily created state (zone, logger,
  // listener-less process state) exist before a baseline is taken.
  void OpenCheckClose(PeerProcess& importer, const std::string& handle, uint64_t size, int seed) {
    const std::string ptr = Value(importer.Call("open " + handle));
    ASSERT_FALSE(ptr.empty());
    EXPECT_EQ(importer.Call("check " + ptr + " " + Hex(size) + " " + std::to_string(seed)), "ok");
    EXPECT_EQ(importer.Call("close " + ptr), "ok");
  }

  std::vector<std::pair<std::string, std::string>> logs_;
  std::map<const PeerProcess*, std::string> log_of_;
};

}  // namespace vmmipc::testing
