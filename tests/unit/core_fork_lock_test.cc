// A fork while another thread is inside the critical section of a lock that
// the forked child's cleanup needs (issue 24: 4 of 300 DataLoader workers
// kept their parent's exported fds, and so its GPU memory, for their life).
// The child must still close its copies of the parent's exported fds (the
// mapping table's cache, the export keep-alive) and of the watch connections.
//
// The other thread is stopped inside the critical section by a hold point in
// the syscall it makes there: this binary is linked with -Wl,--wrap=fcntl
// (the mapping table dup()s a cached fd under its lock) and --wrap=write (the
// watch client wakes its thread under its lock; --wrap=poll: the exporter's
// watch list looks for hung-up importers under its lock), tests/CMakeLists.txt. The
// held thread stays there until the forking thread blocks in a futex wait (a
// fork handler waiting for the lock: the holder is let go, its critical
// section ends, and the fork goes on), or until fork() has returned without
// ever waiting (the child was made while the lock was held). No timing: each
// side waits for what the other did. The stand-ins for exported fds are
// memfds (the simulated driver's are too), told apart by their names.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/scoped_fd.h"
#include "core/process_state.h"
#include "ledger/vmm_mappings.h"
#include "test_process.h"
#include "transport/client/fetch_client.h"
#include "transport/client/watch_client.h"
#include "transport/serve/watch/watchers.h"

extern "C" int __real_fcntl(int fd, int cmd, ...);
extern "C" ssize_t __real_write(int fd, const void* buffer, size_t size);
extern "C" int __real_poll(pollfd* fds, nfds_t count, int timeout);

namespace {

// The hold point: armed for one call, on one thread.
std::atomic<int> g_hold_dup_of{-1};                // F_DUPFD_CLOEXEC of this fd holds
thread_local bool t_hold_next_wake = false;        // this thread's next 8-byte write holds
std::atomic<bool> g_hold_hang_up_check{false};     // the next poll for a hang-up holds
std::atomic<bool> g_held{false};                   // a thread is held (inside the lock)
std::atomic<bool> g_release{false};                // fork() returned: go on
std::atomic<pid_t> g_forker{0};                    // the thread that forks
thread_local bool t_fork_inside_the_hold = false;  // this thread forks from the hold itself
std::atomic<pid_t> g_inner_child{-1};

void Hold() {
  g_held = true;
  if (t_fork_inside_the_hold) {
    t_fork_inside_the_hold = false;
    // The lock's holder forks itself (as a signal handler could): the fork
    // handler must not wait for a lock its own thread holds.
    const pid_t child = fork();
    if (child == 0) _exit(0);
    g_inner_child = child;
    return;
  }
  while (!g_release.load() && !vmmipc::testing::WaitsInFutex(g_forker.load())) sched_yield();
}

}  // namespace

extern "C" int __wrap_fcntl(int fd, int cmd, ...) {
  va_list args;
  va_start(args, cmd);
  void* arg = va_arg(args, void*);  // an int or a pointer: passed on as it came
  va_end(args);
  int expected = fd;
  if (cmd == F_DUPFD_CLOEXEC && g_hold_dup_of.compare_exchange_strong(expected, -1)) {
    Hold();
    errno = EMFILE;  // the dup fails: the held thread ends up with no fd of its own
    return -1;
  }
  return __real_fcntl(fd, cmd, arg);
}

extern "C" ssize_t __wrap_write(int fd, const void* buffer, size_t size) {
  if (t_hold_next_wake && size == sizeof(uint64_t)) {
    t_hold_next_wake = false;
    Hold();
  }
  return __real_write(fd, buffer, size);
}

extern "C" int __wrap_poll(pollfd* fds, nfds_t count, int timeout) {
  bool armed = true;
  // The watch list's look for hung-up importers: one fd, no wait, POLLRDHUP asked.
  if (count == 1 && timeout == 0 && (fds[0].events & POLLRDHUP) != 0 &&
      g_hold_hang_up_check.compare_exchange_strong(armed, false))
    Hold();
  return __real_poll(fds, count, timeout);
}

namespace vmmipc::core {
namespace {

constexpr char kExported[] = "vmmipc-fork-lock-test-exported";
constexpr uint64_t kChunk = 2u << 20;

ScopedFd Memfd(const char* name) { return ScopedFd(memfd_create(name, MFD_CLOEXEC)); }

// This process's fds whose target names `what` ("/memfd:<name>", "socket:[<inode>]").
int FdsTo(const std::set<std::string>& what) {
  int n = 0;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", error)) {
    std::error_code unreadable;
    const std::string target = std::filesystem::read_symlink(entry.path(), unreadable).string();
    for (const std::string& prefix : what) n += target.rfind(prefix, 0) == 0;
  }
  return n;
}

std::string SocketTarget(int fd) {
  struct stat st {};
  return fstat(fd, &st) == 0 ? "socket:[" + std::to_string(st.st_ino) + "]" : "?";
}

// Forks once the holder is held; the child exits with the number of fds it
// still has to `what` (0: its cleanup closed them all). Returns that number,
// or -1 when the child did not exit normally.
// A forked child's exit without the sanitizers' end-of-process report: the
// parent's threads are copied into ThreadSanitizer's records and would be
// reported as leaked (exit code 66) in a child that has only one.
[[noreturn]] void ChildExit(int code) {
  syscall(SYS_exit_group, code);
  __builtin_unreachable();
}

int ForkWhileHeld(const std::set<std::string>& what) {
  while (!g_held.load()) sched_yield();
  g_forker = static_cast<pid_t>(syscall(SYS_gettid));
  const pid_t child = fork();
  if (child == 0) ChildExit(std::min(FdsTo(what), 100));
  g_release = true;
  if (child < 0) return -1;
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

void ResetHold() {
  g_held = false;
  g_release = false;
  g_hold_dup_of = -1;
}

// Three chunks with a cached exported fd each, and the export keep-alive.
struct Exported {
  std::vector<uint64_t> bases;
  std::vector<uint32_t> generations;
  std::vector<int> cached;  // the cache's fd numbers
};
Exported ExportThree(ProcessState& state, uint64_t first_base) {
  Exported out;
  ledger::VmmMappings& table = state.exporter.mappings();
  for (uint64_t i = 0; i < 3; ++i) {
    ledger::VmmMapping mapping;
    mapping.base = first_base + i * kChunk;
    mapping.size = kChunk;
    mapping.posix_fd_exportable = true;
    mapping.device = 0;
    mapping.region_base = first_base;
    mapping.region_end = first_base + 3 * kChunk;
    const uint32_t generation = table.Add(mapping);
    ScopedFd fd = Memfd(kExported);
    out.cached.push_back(fd.get());
    std::vector<ScopedFd> evicted;
    ScopedFd copy = table.CacheFd(mapping.base, generation, std::move(fd), &evicted);
    EXPECT_TRUE(copy.valid());  // the grant's dup; the cache keeps the original
    out.bases.push_back(mapping.base);
    out.generations.push_back(generation);
  }
  return out;
}

TEST(CoreForkLocks, TheChildClosesTheCachedFdsWhileAnotherThreadHoldsTheMappingTable) {
  ResetHold();
  ProcessState& state = State();
  const Exported exported = ExportThree(state, 0x7e0000000000);
  state.exporter.HoldExportKeepAlive(0, Memfd(kExported));
  const std::set<std::string> targets = {std::string("/memfd:") + kExported};
  ASSERT_EQ(FdsTo(targets), 4);

  // A grant's dup of chunk 0's fd, held under the table's (exclusive) lock.
  g_hold_dup_of = exported.cached[0];
  std::thread holder([&] {
    EXPECT_FALSE(
        state.exporter.mappings().DupCachedFd(exported.bases[0], exported.generations[0]).valid());
  });
  const int kept = ForkWhileHeld(targets);
  holder.join();
  EXPECT_EQ(kept, 0) << "the forked child kept copies of the parent's exported fds";

  // The parent keeps its own, and its table's lock is free again.
  EXPECT_EQ(FdsTo(targets), 4);
  EXPECT_TRUE(
      state.exporter.mappings().DupCachedFd(exported.bases[1], exported.generations[1]).valid());
  // And a fork nobody contends for cleans up as well.
  ResetHold();
  g_held = true;
  EXPECT_EQ(ForkWhileHeld(targets), 0);
  state.exporter.mappings().Remove(exported.bases[0], 3 * kChunk);
}

TEST(CoreForkLocks, TheChildClosesTheWatchConnectionsWhileAnotherThreadHoldsTheWatchClient) {
  ResetHold();
  ProcessState& state = State();
  auto make = [](void** context) {
    *context = nullptr;
    return std::make_unique<transport::WatchClient>(
        [](uint64_t, const transport::wire::Event&, ScopedFd) {
          return transport::wire::AckStatus::kDone;
        },
        Timeout::Ms(1000));
  };
  // The exporters' ends stay here; the importer's ends go to the watch client.
  std::vector<ScopedFd> exporter_ends;
  std::set<std::string> targets;
  auto connection = [&] {
    int sv[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    exporter_ends.emplace_back(sv[0]);
    targets.insert(SocketTarget(sv[1]));
    transport::WatchConnection c;
    c.fd.Reset(sv[1]);
    return c;
  };
  std::string error;
  ASSERT_TRUE(state.importer.follow().AddWatch(0x1111, connection(), make, &error)) << error;
  transport::WatchConnection second = connection();
  ASSERT_EQ(FdsTo(targets), 2);

  // The second connection added, the client's thread woken under its lock: held there.
  std::thread holder([&] {
    t_hold_next_wake = true;
    std::string add_error;
    EXPECT_TRUE(state.importer.follow().AddWatch(0x2222, std::move(second), make, &add_error))
        << add_error;
  });
  const int kept = ForkWhileHeld(targets);
  holder.join();
  EXPECT_EQ(kept, 0) << "the forked child kept copies of the parent's watch connections";
  EXPECT_EQ(FdsTo(targets), 2);
  EXPECT_TRUE(state.importer.follow().Watches(0x2222));
}

// The thread inside the mapping table's critical section forks itself (a
// signal handler there could): the fork must not wait for a lock its own
// thread holds. Its child may keep the fds then; it must exist and exit.
TEST(CoreForkLocks, AForkFromInsideTheCriticalSectionDoesNotWaitForItself) {
  ResetHold();
  ProcessState& state = State();
  const Exported exported = ExportThree(state, 0x7d0000000000);
  g_inner_child = -1;
  g_hold_dup_of = exported.cached[1];
  std::thread holder([&] {
    t_fork_inside_the_hold = true;
    EXPECT_FALSE(
        state.exporter.mappings().DupCachedFd(exported.bases[1], exported.generations[1]).valid());
  });
  holder.join();
  const pid_t child = g_inner_child.load();
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_TRUE(
      state.exporter.mappings().DupCachedFd(exported.bases[1], exported.generations[1]).valid());
  state.exporter.mappings().Remove(exported.bases[0], 3 * kChunk);
}

// The exporter's watch list (transport/serve/watch/watchers.h), which lives in the
// listener; here one of its own, with the fork handlers core registers for
// the process state's (ExportSide::PrepareFork and the rest) registered for
// it. The second Adopt looks for hung-up importers under the list's lock and
// is held there; the connection it adopts is still in its hands (not in the
// list) at the fork, so only the first one is checked.
transport::Watchers* g_watchers = nullptr;

TEST(CoreForkLocks, TheChildClosesTheWatchListWhileAnotherThreadHoldsIt) {
  ResetHold();
  static transport::Watchers watchers;
  g_watchers = &watchers;
  pthread_atfork([] { g_watchers->PrepareFork(); }, [] { g_watchers->ParentAfterFork(); },
                 [] { g_watchers->AbandonAfterFork(); });
  std::vector<ScopedFd> importer_ends;
  std::vector<std::string> exporter_ends;
  uint32_t follower = 0;
  auto adopt = [&] {
    int sv[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    importer_ends.emplace_back(sv[0]);
    exporter_ends.push_back(SocketTarget(sv[1]));
    // Reserve looks for hung-up watchers under the list's lock (the hold point).
    transport::Watchers::Reservation watcher =
        watchers.Reserve(++follower, 4321, {1, 2}, {}, false);
    ASSERT_NE(watcher, nullptr);
    watchers.Activate(watcher, ScopedFd(sv[1]));
  };
  adopt();
  // Read before the holder adds to the vectors (it may move them).
  const std::string first_end = exporter_ends[0];
  g_hold_hang_up_check = true;
  std::thread holder(adopt);
  const int kept = ForkWhileHeld({first_end});
  holder.join();
  EXPECT_EQ(kept, 0) << "the forked child kept its copy of a watch connection";
  EXPECT_EQ(watchers.count(), 2u);
}

}  // namespace
}  // namespace vmmipc::core
