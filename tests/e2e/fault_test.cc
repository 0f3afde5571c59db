// Fault, concurrency and fork scenarios (issue 6) on real processes: an
// exporter killed before, during or after the fd transfer, exited or freed;
// a squatter on a dead exporter's socket name; a client of another uid; a
// stale token; silent and truncated peers; an importer out of fds; a taken
// zone; a run beyond its slot; driver failures injected on both sides; many
// threads on both sides; fork of exporters and importers; CLOEXEC. Each fault
// is checked for its CUresult, its log line, a bounded wait, and for leaving
// no fd, mapping, reservation or allocation behind (vmmipc_peer `fds` and
// `stats` before and after). Same harness as e2e_test.cc: label sim on the
// simulated driver, label gpu on the real one (simulator-only parts skip).
#include <cuda.h>
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iostream>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "e2e_layout.h"
#include "handle_hex.h"
#include "ledger/handle_codec.h"
#include "logged_peer_test.h"
#include "peer_process.h"

namespace vmmipc::testing {
namespace {

// One message with one descriptor attached (SCM_RIGHTS), as a hand-made
// peer sends it; returns sendmsg's result.
ssize_t SendWithFd(int sock, const void* bytes, size_t size, int fd) {
  iovec iov{const_cast<void*>(bytes), size};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  return sendmsg(sock, &m, MSG_NOSIGNAL);
}

// --- raw protocol pieces, for the test process acting as a hostile peer ----------------------

// The exporter's abstract name "\0vmmipc.<euid>.i<instance>" (docs/protocol.md):
// the instance of its handles.
std::string AbstractNameOf(const ledger::Vmm2Handle& h, uint32_t uid = geteuid()) {
  char instance[16];
  std::snprintf(instance, sizeof(instance), "%08x", h.instance);
  return "vmmipc." + std::to_string(uid) + ".i" + instance;
}

sockaddr_un AbstractName(const ledger::Vmm2Handle& h, socklen_t* length) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string name = AbstractNameOf(h);
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  *length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return addr;
}

int ConnectTo(const ledger::Vmm2Handle& h) {
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  socklen_t length = 0;
  const sockaddr_un addr = AbstractName(h, &length);
  if (fd >= 0 && connect(fd, reinterpret_cast<const sockaddr*>(&addr), length) == 0) return fd;
  if (fd >= 0) close(fd);
  return -1;
}

void Put(std::vector<uint8_t>* out, size_t offset, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) (*out)[offset + i] = static_cast<uint8_t>(value >> (8 * i));
}

// A request of this version whose MAC is garbage: right fields, wrong proof.
std::vector<uint8_t> RawRequest(const ledger::Vmm2Handle& h) {
  std::vector<uint8_t> r(80, 0);  // docs/protocol.md, version 2
  Put(&r, 0, 0x51524d56, 4);      // "VMRQ"
  Put(&r, 4, 2, 2);
  Put(&r, 8, h.pid, 4);
  for (int i = 16; i < 32; ++i) r[i] = static_cast<uint8_t>(i);
  Put(&r, 32, h.address, 8);
  Put(&r, 40, h.chunk_base, 8);
  Put(&r, 48, h.chunk_size, 8);
  Put(&r, 56, h.region_base, 8);
  Put(&r, 64, h.generation, 4);
  Put(&r, 68, h.rank_slot, 2);
  Put(&r, 72, 0xabababababababab, 8);  // a MAC nobody made
  return r;
}

// The status of the one reply message on `fd` (RefuseReason; 0 = grant),
// -1 on EOF or timeout, -2 when it is not a reply.
int ReplyStatus(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) <= 0) return -1;
  uint8_t buf[8192];
  const ssize_t n = recv(fd, buf, sizeof(buf), 0);
  if (n <= 0) return -1;
  if (n < 32 || std::memcmp(buf, "VMRP", 4) != 0) return -2;
  return buf[6] | (buf[7] << 8);
}

// A process that took the socket name of a dead exporter: binds it and
// answers every connection as `mode` says. It does not hold the exporter's
// secret, so it cannot MAC anything the importer would accept.
class Squatter {
 public:
  enum class Mode { kForgedGrant, kBareBadToken, kGarbage, kSilent };

  Squatter(Mode mode, const ledger::Vmm2Handle& h) : mode_(mode), handle_(h) {
    listen_fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    socklen_t length = 0;
    const sockaddr_un addr = AbstractName(h, &length);
    bound_ = listen_fd_ >= 0 &&
             bind(listen_fd_, reinterpret_cast<const sockaddr*>(&addr), length) == 0 &&
             listen(listen_fd_, 8) == 0 && pipe2(stop_, O_CLOEXEC) == 0;
    if (bound_) thread_ = std::thread([this] { Run(); });
  }
  ~Squatter() {
    if (thread_.joinable()) {
      (void)!write(stop_[1], "x", 1);
      thread_.join();
    }
    for (int fd : {listen_fd_, stop_[0], stop_[1]})
      if (fd >= 0) close(fd);
  }
  bool bound() const { return bound_; }
  int connections() const { return connections_; }

 private:
  void Run() {
    std::vector<int> held;
    for (;;) {
      pollfd p[2] = {{listen_fd_, POLLIN, 0}, {stop_[0], POLLIN, 0}};
      if (poll(p, 2, 10000) <= 0 || p[1].revents != 0) break;
      const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (conn < 0) continue;
      ++connections_;
      held.push_back(conn);
      pollfd r{conn, POLLIN, 0};
      uint8_t request[512];
      if (poll(&r, 1, 5000) <= 0 || recv(conn, request, sizeof(request), 0) <= 0) continue;
      Answer(conn);
    }
    for (int fd : held) close(fd);
  }

  void Answer(int conn) {
    std::vector<uint8_t> msg(32, 0);
    Put(&msg, 0, 0x50524d56, 4);           // "VMRP"
    Put(&msg, 4, 2, 2);                    // the protocol's version (docs/protocol.md)
    Put(&msg, 24, 0x4242424242424242, 8);  // a MAC it cannot compute
    switch (mode_) {
      case Mode::kSilent:
        return;
      case Mode::kGarbage:
        msg.assign(100, 0x5a);
        break;
      case Mode::kBareBadToken:
        Put(&msg, 6, 1, 2);   // kBadToken
        Put(&msg, 16, 1, 4);  // batch 0 of 1, no entries
        break;
      case Mode::kForgedGrant: {
        Put(&msg, 8, 1, 4);   // one chunk
        Put(&msg, 16, 1, 4);  // batch 0 of 1
        Put(&msg, 20, 1, 4);  // one entry
        msg.resize(56, 0);
        Put(&msg, 32, handle_.chunk_base, 8);
        Put(&msg, 40, handle_.chunk_size, 8);
        Put(&msg, 48, handle_.generation, 8);
        const int memfd = memfd_create("squatter", MFD_CLOEXEC);
        (void)!ftruncate(memfd, static_cast<off_t>(handle_.chunk_size));
        (void)SendWithFd(conn, msg.data(), msg.size(), memfd);
        close(memfd);
        return;
      }
    }
    (void)!send(conn, msg.data(), msg.size(), MSG_NOSIGNAL);
  }

  Mode mode_;
  ledger::Vmm2Handle handle_;
  int listen_fd_ = -1;
  int stop_[2] = {-1, -1};
  bool bound_ = false;
  std::atomic<int> connections_{0};
  std::thread thread_;
};

// --- an exporter at rest ------------------------------------------------------------------------

// The inodes of the sockets in `pid`'s fd table.
std::set<std::string> SocketInodesOf(pid_t pid) {
  std::set<std::string> inodes;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      char target[64];
      const ssize_t n = readlink((dir + "/" + e->d_name).c_str(), target, sizeof(target) - 1);
      if (n <= 0) continue;
      const std::string link(target, static_cast<size_t>(n));
      if (StartsWith(link, "socket:[")) inodes.insert(link.substr(8, link.size() - 9));
    }
    closedir(d);
  }
  return inodes;
}

// How many connections a vmmipc listener accepted that `pid` still holds:
// its connected Unix sockets (state 03 in /proc/net/unix) bound to an
// @vmmipc. name, which an accepted socket inherits from its listener. A
// process that imports nothing holds no other such socket.
int AcceptedConnectionsOf(pid_t pid) {
  const std::set<std::string> inodes = SocketInodesOf(pid);
  std::ifstream table("/proc/net/unix");
  std::string line;
  std::getline(table, line);  // the header
  int accepted = 0;
  while (std::getline(table, line)) {
    std::istringstream fields(line);
    std::string num, refs, protocol, flags, type, st, inode, path;
    if (!(fields >> num >> refs >> protocol >> flags >> type >> st >> inode)) continue;
    fields >> path;
    accepted += st == "03" && StartsWith(path, "@vmmipc.") && inodes.count(inode) != 0;
  }
  return accepted;
}

// Whether every thread of `pid` sleeps ('S' in /proc/<pid>/task/<tid>/stat;
// 'T' stopped counts too): none is midway through a step. A woken thread is
// 'R' from its wake-up on, before it runs.
bool AllThreadsAsleep(pid_t pid) {
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = opendir(tasks.c_str());
  if (d == nullptr) return false;
  bool asleep = true;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream stat(tasks + "/" + e->d_name + "/stat");
    const std::string text((std::istreambuf_iterator<char>(stat)),
                           std::istreambuf_iterator<char>());
    const size_t paren = text.rfind(')');
    if (paren == std::string::npos || paren + 2 >= text.size()) continue;  // the thread ended
    const char state = text[paren + 2];
    asleep = asleep && (state == 'S' || state == 'T');
  }
  closedir(d);
  return asleep;
}

// The fds an exporter holds for good, counted when it is at rest (at most
// `bound_ms`, else -1): no connection of its listener open (a reply's fds
// close on the listener's thread before it looks at the connection again),
// and every thread asleep, twice with the same count between (an export
// ahead, queued before the call that queued it returned, is done, with the
// dup it takes of the fd it caches). The count does not depend on when
// short-lived fds close, only on what the exporter keeps: these tests failed
// once in 40 loaded runs when it was read once it had not changed for 300 ms.
// `kept`: the accepted connections it keeps for good (watch connections),
// which it then holds at rest.
int RestingFdsOf(pid_t pid, int bound_ms = 10000, int kept = 0) {
  const auto start = Clock::now();
  while (MsSince(start) < bound_ms) {
    const int fds = FdsOf(pid);
    if (AcceptedConnectionsOf(pid) == kept && AllThreadsAsleep(pid)) {
      usleep(2000);
      if (FdsOf(pid) == fds && AllThreadsAsleep(pid) && AcceptedConnectionsOf(pid) == kept)
        return fds;
    }
    usleep(2000);
  }
  ADD_FAILURE() << "pid " << pid << " did not come to rest in " << bound_ms << " ms";
  return -1;
}

// --- the fixture ------------------------------------------------------------------------------

// The fixture is the shared one (logged_peer_test.h).
// The fault scenarios count what the fetch and serve paths hold, to the fd,
// at rest and after each failure, and some pin legacy IPC's semantics (an
// open import survives its exporter's free): their peers run with follow
// off, so that the counts are those paths' alone. What follow (the default)
// holds and does under the same faults (a gone, stopped or slow importer, an
// exporter that stops reading, opens in flight) is tested in follow_test.cc,
// follow_holders_test.cc and unit.WatchClient*.
class Fault : public LoggedPeerTest {
 protected:
  Fault() { default_env_.emplace("VMMIPC_FOLLOW", "0"); }
};

// Warm connections through the whole library: an importer's second open of
// an exporter goes on the connection its first one kept (the open's debug
// line says so); when that exporter is killed, the next open of its handle
// fails at once as before, and the importer holds no more than before it.
TEST_F(Fault, WarmConnectionIsReusedAndGivenUpWhenItsExporterDies) {
  auto exporter = Peer("exporter", "0");
  auto importer =
      Peer("importer", "1", {{"VMMIPC_WARM_CONNECTIONS", "64"}, {"VMMIPC_LOG_LEVEL", "debug"}});
  const std::string a = Handle(*exporter, VmmBuffer(*exporter, "a", 1, 1));
  const std::string b = Handle(*exporter, VmmBuffer(*exporter, "b", 1, 2));
  const std::string c = Handle(*exporter, VmmBuffer(*exporter, "c", 1, 3));
  const std::string pa = Value(importer->Call("open " + a));
  ASSERT_FALSE(pa.empty());
  EXPECT_EQ(Log(*importer).find("(warm connection"), std::string::npos);
  const std::string pb = Value(importer->Call("open " + b));
  ASSERT_FALSE(pb.empty());
  EXPECT_NE(Log(*importer).find("(warm connection"), std::string::npos)
      << "the second open did not reuse the first one's connection";
  EXPECT_EQ(importer->Call("check " + pb + " " + Hex(kChunk) + " 2"), "ok");
  const Resources before = Held(*importer);
  exporter->Kill();
  const auto start = Clock::now();
  EXPECT_TRUE(StartsWith(importer->Call("open " + c), ErrPrefix(CUDA_ERROR_INVALID_HANDLE)));
  EXPECT_LT(MsSince(start), 2000);
  EXPECT_EQ(Held(*importer).fds, before.fds - 1) << "the dead exporter's kept connection";
  EXPECT_EQ(importer->Call("close " + pa), "ok");
  EXPECT_EQ(importer->Call("close " + pb), "ok");
}

// --- the exporter goes away ---------------------------------------------------------------

TEST_F(Fault, ExporterKilledBeforeServingTheRequestFailsOpenAtOnceAndLeavesNothing) {
  auto exporter = Peer("exporter", "0");
  auto importer = Peer("importer", "1", {{"VMMIPC_TIMEOUT_MS", "10000"}});
  const std::string handle = Handle(*exporter, VmmBuffer(*exporter, "a", 2, 1));
  const Resources before = Held(*importer);

  // Stopped, the exporter cannot accept: the importer's request waits in its backlog.
  ASSERT_TRUE(StopAndWait(exporter->pid()));
  const int importer_fds = FdsOf(importer->pid());
  auto answer = std::async(std::launch::async, [&] { return importer->Call("open " + handle); });
  // Connected (one more fd), and waiting in poll: the request is sent.
  EXPECT_TRUE(WaitUntil(
      [&] { return FdsOf(importer->pid()) > importer_fds && WaitsInPoll(importer->pid(), true); }));
  const auto start = Clock::now();
  exporter->Kill();
  const std::string result = answer.get();

  EXPECT_TRUE(StartsWith(result, ErrPrefix(CUDA_ERROR_MAP_FAILED))) << result;
  EXPECT_LT(MsSince(start), 2000) << "must not wait for its own 10 s timeout";
  EXPECT_NE(Log(*importer).find("closed the connection; returning CUDA_ERROR_MAP_FAILED"),
            std::string::npos);
  EXPECT_EQ(Held(*importer), before);
}

TEST_F(Fault, ExporterKilledWhilePreparingTheFdsFailsOpenAndLeavesNothing) {
  // The exporter exports one fd per chunk before it sends anything; a large
  // run makes that phase long enough to stop the exporter inside it, seen
  // from outside as its fd count rising.
  // No page-table anchors: a run that was sent in full before the stop is
  // closed again, and its close would leave one (zone_anchor_test.cc has them).
  auto importer =
      Peer("importer", "1", {{"VMMIPC_TIMEOUT_MS", "20000"}, {"VMMIPC_ZONE_ANCHORS", "0"}});
  ASSERT_TRUE(StartsWith(importer->Call("nofile_max"), "ok"));
  const Resources before = Held(*importer);
  bool caught = false;
  for (int chunks : {512, 1024, 2048, 4096}) {
    auto exporter =
        Peer("exporter" + std::to_string(chunks), "0", {{"SIMCUDA_TOTAL_MEM_MIB", "65536"}});
    ASSERT_TRUE(StartsWith(exporter->Call("nofile_max"), "ok"));
    const uint64_t base =
        Num(Value(exporter->Call("alloc_vmm a " + Hex(kChunk) + " " + std::to_string(chunks))));
    ASSERT_NE(base, 0u);
    ASSERT_EQ(exporter->Call("fill " + Hex(base) + " " + Hex(kChunk) + " 2"), "ok");
    const std::string handle = Handle(*exporter, base);
    // The get's export ahead runs on: its chunk, and before it the exporter's
    // warm-up (export keep-alive, fd table). Idle is at rest.
    const int idle = RestingFdsOf(exporter->pid());

    auto answer = std::async(std::launch::async, [&] { return importer->Call("open " + handle); });
    const auto start = Clock::now();
    int seen = idle;
    while (seen < idle + chunks / 4 && MsSince(start) < 10000 &&
           answer.wait_for(std::chrono::seconds(0)) != std::future_status::ready)
      seen = FdsOf(exporter->pid());
    kill(exporter->pid(), SIGSTOP);
    seen = FdsOf(exporter->pid());
    const bool mid_export = seen > idle && seen < idle + chunks;
    exporter->Kill();
    const std::string result = answer.get();
    if (StartsWith(result, "ok ")) {
      // Too late: the transfer was complete, the memory outlives its exporter.
      // (The fd count cannot tell: the exporter keeps one exported fd per
      // chunk in its cache after sending, so it stays below idle + chunks.)
      EXPECT_EQ(importer->Call("check " + Value(result) + " " + Hex(kChunk) + " 2"), "ok");
      EXPECT_EQ(importer->Call("close " + Value(result)), "ok");
    } else {
      // Stopped before the reply was sent: the importer sees the connection end.
      EXPECT_TRUE(StartsWith(result, ErrPrefix(CUDA_ERROR_MAP_FAILED))) << result;
      caught = mid_export;
    }
    Resources after = Settled(*importer, before);
    after.reservations = before.reservations;  // the zone stays once a run was placed
    EXPECT_EQ(after, before) << chunks << " chunks";
    if (caught) break;
  }
  if (!caught) {
    GTEST_SKIP() << "never caught the exporter inside its export phase";
  }
}

TEST_F(Fault, HungExporterCostsTheImporterItsTimeoutThenServesAgain) {
  auto exporter = Peer("exporter", "0");
  auto importer = Peer("importer", "1", {{"VMMIPC_TIMEOUT_MS", "1000"}});
  const std::string handle = Handle(*exporter, VmmBuffer(*exporter, "a", 1, 22));
  const Resources before = Held(*importer);
  ASSERT_TRUE(StopAndWait(exporter->pid()));
  const auto start = Clock::now();
  const std::string result = importer->Call("open " + handle);
  const long elapsed = MsSince(start);
  ASSERT_EQ(kill(exporter->pid(), SIGCONT), 0);
  EXPECT_TRUE(StartsWith(result, ErrPrefix(CUDA_ERROR_MAP_FAILED))) << result;
  EXPECT_GE(elapsed, 900);
  EXPECT_LT(elapsed, 2500);
  EXPECT_NE(Log(*importer).find("no answer within 1000 ms; returning CUDA_ERROR_MAP_FAILED"),
            std::string::npos);
  EXPECT_EQ(Held(*importer), before);
  // Resumed, the exporter finds that importer gone and serves the next one.
  OpenCheckClose(*importer, handle, kChunk, 22);
}

TEST_F(Fault, ExporterKilledAfterTheTransferLeavesTheImportReadableAndClosable) {
  auto exporter = Peer("exporter", "0");
  auto importer = Peer("importer", "1", {{"VMMIPC_TIMEOUT_MS", "2000"}});
  const std::string handle = Handle(*exporter, VmmBuffer(*exporter, "a", 2, 3));
  const std::string ptr = Value(importer->Call("open " + handle));
  ASSERT_FALSE(ptr.empty());
  exporter->Kill();
  EXPECT_EQ(importer->Call("check " + ptr + " " + Hex(2 * kChunk) + " 3"), "ok");
  // Still open: the same handle gives the same pointer without asking anyone.
  EXPECT_EQ(importer->Call("open " + handle), "ok " + ptr);
  EXPECT_EQ(importer->Call("close " + ptr), "ok");
  EXPECT_EQ(importer->Call("close " + ptr), "ok");
  // Closed: a new open must ask the exporter, who is gone.
  const auto start = Clock::now();
  EXPECT_TRUE(StartsWith(importer->Call("open " + handle), ErrPrefix(CUDA_ERROR_INVALID_HANDLE)));
  EXPECT_LT(MsSince(start), 2000);
  if (Sim()) {
    EXPECT_EQ(Held(*importer).mappings, 1);  // the page-table anchor of the stretch it used
  }
}

TEST_F(Fault, ExporterThatExitedFailsOpenAtOnceAsInvalidHandle) {
  auto exporter = Peer("exporter", "0");
  auto importer = Peer("importer", "1");
  const std::string handle = Handle(*exporter, VmmBuffer(*exporter, "a", 1, 4));
  const std::string name = AbstractNameOf(Decode(handle));
  exporter.reset();  // "exit": a clean exit, listener and all
  const Resources before = Held(*importer);
  const auto start = Clock::now();
  EXPECT_TRUE(StartsWith(importer->Call("open " + handle), ErrPrefix(CUDA_ERROR_INVALID_HANDLE)));
  EXPECT_LT(MsSince(start), 2000);
  EXPECT_NE(Log(*importer).find("nobody listens on @" + name), std::string::npos);
  EXPECT_EQ(Held(*importer), before);
}

TEST_F(Fault, MemoryFreedByTheExporterIsRefusedAndAnOpenImportSurvivesTheFree) {
  auto exporter = Peer("exporter", "0");
  auto importer = Peer("importer", "1");
  const std::string kept = Handle(*exporter, VmmBuffer(*exporter, "kept", 2, 5));
  const std::string freed = Handle(*exporter, VmmBuffer(*exporter, "freed", 1, 6));
  const std::string ptr = Value(importer->Call("open " + kept));
  ASSERT_FALSE(ptr.empty());
  ASSERT_EQ(exporter->Call("free_vmm kept"), "ok");
  ASSERT_EQ(exporter->Call("free_vmm freed"), "ok");
  // Open before the free: still the exporter's bytes.
  EXPECT_EQ(importer->Call("check " + ptr + " " + Hex(2 * kChunk) + " 5"), "ok");
  const Resources before = Held(*importer);
  EXPECT_TRUE(StartsWith(importer->Call("open " + freed), ErrPrefix(CUDA_ERROR_INVALID_HANDLE)));
  EXPECT_EQ(Held(*importer), before);
  EXPECT_NE(Log(*importer).find("refused: freed; returning CUDA_ERROR_INVALID_HANDLE"),
            std::string::npos);
  EXPECT_NE(Log(*exporter).find(": freed ("), std::string::npos);
  EXPECT_EQ(importer->Call("close " + ptr), "ok");
  if (Sim()) {
    EXPECT_EQ(Held(*importer).mappings, 1);  // the page-table anchor of the stretch it used
  }
}

// Issue 24 item 3: the wire names no offset, so an importer maps each chunk of
// a run from offset 0 of its allocation. A run with a chunk mapped at another
// offset (the simulator allows it; today's driver does not) is refused, with
// that chunk and its offset on the exporter's one warning line, instead of
// mapping other bytes at its place; nothing is left behind on either side.
// The run's first chunk is mapped through vmmipc's cuMemMap hook (the run
// comes from the mapping table) or past it (the exporter walks the run
// through the driver, which knows no offsets: the second chunk's comes from
// the table).
TEST_F(Fault, RunWithAChunkMappedAtAnOffsetOfItsAllocationIsRefused) {
  if (!Sim()) {
    GTEST_SKIP() << "today's driver refuses a cuMemMap at a non-zero offset";
  }
  for (const bool untracked : {false, true}) {
    SCOPED_TRACE(untracked ? "first chunk mapped past the hook" : "run from the mapping table");
    auto exporter = Peer("exporter", "0", {{"VMMIPC_STATS", "1"}});
    auto importer = Peer("importer", "1", {{"VMMIPC_STATS", "1"}});
    // The importer's zone and the exporter's listener exist from here on.
    OpenCheckClose(*importer, Handle(*exporter, VmmBuffer(*exporter, "warm", 1, 60)), kChunk, 60);
    const uint64_t base = Num(Value(
        exporter->Call("alloc_vmm_offset o " + Hex(kChunk) + (untracked ? " untracked" : ""))));
    ASSERT_NE(base, 0u);
    ASSERT_EQ(exporter->Call("fill " + Hex(base) + " " + Hex(2 * kChunk) + " 61"), "ok");
    const std::string handle = Handle(*exporter, base);
    const Resources importer_before = Steady(*importer);
    const Resources exporter_before = Steady(*exporter);  // the get's export ahead is done
    const size_t importer_mark = Log(*importer).size(), exporter_mark = Log(*exporter).size();

    const std::string result = importer->Call("open " + handle);
    EXPECT_TRUE(StartsWith(result, ErrPrefix(CUDA_ERROR_MAP_FAILED))) << result;
    if (StartsWith(result, "ok ")) {
      // What the refusal prevents: the second chunk mapped from offset 0.
      const uint64_t second = Num(Value(result)) + kChunk;
      ADD_FAILURE() << "the second chunk of the run reads: "
                    << importer->Call("check " + Hex(second) + " " + Hex(kChunk) + " 61 " +
                                      Hex(kChunk));
      EXPECT_EQ(importer->Call("close " + Value(result)), "ok");
    }
    EXPECT_TRUE(LogShows(*exporter, "refused peer", 3000, exporter_mark));
    const std::string exporter_log = Log(*exporter).substr(exporter_mark);
    const std::string importer_log = Log(*importer).substr(importer_mark);
    EXPECT_EQ(Occurrences(exporter_log, "refused peer"), 1u) << exporter_log;
    EXPECT_NE(exporter_log.find("refused peer pid " + std::to_string(importer->pid()) + " uid " +
                                std::to_string(geteuid()) + " for address " + Hex(base) +
                                ": export failed (chunk " + Hex(base + kChunk) +
                                " of the run is mapped at offset " + Hex(kChunk) +
                                " of its allocation; vmmipc shares chunks mapped from offset 0 "
                                "only)"),
              std::string::npos)
        << exporter_log;
    EXPECT_EQ(Occurrences(importer_log, "cuIpcOpenMemHandle("), 1u) << importer_log;
    EXPECT_NE(importer_log.find("cuIpcOpenMemHandle(pid " + std::to_string(exporter->pid()) + ", " +
                                Hex(base) + "): exporter pid " + std::to_string(exporter->pid()) +
                                " refused: export failed; returning CUDA_ERROR_MAP_FAILED"),
              std::string::npos)
        << importer_log;
    EXPECT_EQ(Settled(*importer, importer_before), importer_before);
    EXPECT_EQ(Settled(*exporter, exporter_before), exporter_before);
    EXPECT_EQ(exporter->Call("free_vmm o"), "ok");
    EXPECT_EQ(StatsCounter(ExitLog(&importer), "open_failed_refused"), 1u);
    EXPECT_EQ(StatsCounter(ExitLog(&exporter), "refused_export_failed"), 1u);
  }
}

// --- hostile peers ---------------------------------------------------------------------------

const char* ModeName(Squatter::Mode mode) {
  switch (mode) {
    case Squatter::Mode::kForgedGrant:
      return "ForgedGrant";
    case Squatter::Mode::kBareBadToken:
      return "BareBadToken";
    case Squatter::Mode::kGarbage:
      return "Garbage";
    case Squatter::Mode::kSilent:
      return "Silent";
  }
  return "Unknown";
}
void PrintTo(Squatter::Mode mode, std::ostream* out) { *out << ModeName(mode); }

class SquatterTest : public Fault, public ::testing::WithParamInterface<Squatter::Mode> {};

TEST_P(SquatterTest, SquatterOnADeadExportersNameCannotServeMemory) {
  auto exporter = Peer("exporter", "0");
  auto importer = Peer("importer", "1", {{"VMMIPC_TIMEOUT_MS", "1000"}});
  const std::string handle = Handle(*exporter, VmmBuffer(*exporter, "a", 1, 7));
  const ledger::Vmm2Handle h = Decode(handle);
  exporter->Kill();
  Squatter squatter(GetParam(), h);
  ASSERT_TRUE(squatter.bound());
  const Resources before = Held(*importer);

  const auto start = Clock::now();
  const std::string result = importer->Call("open " + handle);
  const long elapsed = MsSince(start);
  EXPECT_EQ(squatter.connections(), 1);
  switch (GetParam()) {
    case Squatter::Mode::kForgedGrant:
      EXPECT_TRUE(StartsWith(result, ErrPrefix(CUDA_ERROR_NOT_PERMITTED))) << result;
      EXPECT_NE(Log(*importer).find("with a MAC that does not verify: not the exporter that made "
                                    "this handle; returning CUDA_ERROR_NOT_PERMITTED"),
                std::string::npos);
      break;
    case Squatter::Mode::kBareBadToken:
      EXPECT_TRUE(StartsWith(result, ErrPrefix(CUDA_ERROR_INVALID_HANDLE))) << result;
      EXPECT_NE(Log(*importer).find("(unverified answer"), std::string::npos);
      break;
    case Squatter::Mode::kGarbage:
      EXPECT_TRUE(StartsWith(result, ErrPrefix(CUDA_ERROR_MAP_FAILED))) << result;
      EXPECT_NE(Log(*importer).find("bad magic; returning CUDA_ERROR_MAP_FAILED"),
                std::string::npos);
      break;
    case Squatter::Mode::kSilent:
      EXPECT_TRUE(StartsWith(result, ErrPrefix(CUDA_ERROR_MAP_FAILED))) << result;
      EXPECT_GE(elapsed, 900);  // its timeout, VMMIPC_TIMEOUT_MS=1000 ...
      EXPECT_NE(Log(*importer).find("no answer within 1000 ms"), std::string::npos);
      break;
  }
  EXPECT_LT(elapsed, 2500);  // ... and never much more
  // Nothing of the squatter's was mapped or kept. A connection that may hold
  // the squatter's fds is closed by the importer's reaper thread: wait for it.
  Resources after = Held(*importer);
  for (int i = 0; i < 200 && !(after == before); ++i) {
    usleep(10000);
    after = Held(*importer);
  }
  EXPECT_EQ(after, before);
}

INSTANTIATE_TEST_SUITE_P(Modes, SquatterTest,
                         ::testing::Values(Squatter::Mode::kForgedGrant,
                                           Squatter::Mode::kBareBadToken, Squatter::Mode::kGarbage,
                                           Squatter::Mode::kSilent),
                         [](const ::testing::TestParamInfo<Squatter::Mode>& info) {
                           return std::string(ModeName(info.param));
                         });

// Runs `body` in a child that became uid 65534 (root only), under a 30 s
// alarm; its return value is the child's exit code. Returns the child's pid.
pid_t AsNobody(const std::function<int()>& body) {
  const pid_t child = fork();
  if (child == 0) {
    alarm(30);
    if (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 ||
        setresuid(65534, 65534, 65534) != 0)
      _exit(20);
    _exit(body());
  }
  return child;
}

// The root exporter's name, connected to by hand: another user's client would
// not find it under its own uid's name.
int ConnectToRootsName(const ledger::Vmm2Handle& h) {
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string name = AbstractNameOf(h, 0);  // root's name: the test runs as root
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return connect(fd, reinterpret_cast<const sockaddr*>(&addr), length) == 0 ? fd : -1;
}

int ExitCode(pid_t child) {
  int status = 0;
  if (waitpid(child, &status, 0) != child) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST_F(Fault, ClientOfAnotherUidGetsOnlyAWrongUserRefusal) {
  if (geteuid() != 0) {
    GTEST_SKIP() << "needs root to become another user";
  }
  auto exporter = Peer("exporter", "0");
  auto importer = Peer("importer", "1");
  const std::string handle = Handle(*exporter, VmmBuffer(*exporter, "a", 1, 8));
  const ledger::Vmm2Handle h = Decode(handle);
  const std::vector<uint8_t> request = RawRequest(h);
  int sent[2];
  ASSERT_EQ(pipe2(sent, O_CLOEXEC), 0);
  // Stopped while the request is queued, so it is there when the exporter accepts.
  ASSERT_TRUE(StopAndWait(exporter->pid()));
  const pid_t child = AsNobody([&] {
    const int fd = ConnectToRootsName(h);
    if (fd < 0) return 21;
    if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) != 80) return 22;
    (void)!write(sent[1], "s", 1);
    const int status = ReplyStatus(fd, 5000);
    return status == 2 ? 0 : 30 + (status & 0x3f);  // 2: kWrongUser
  });
  ASSERT_GT(child, 0);
  close(sent[1]);
  char c = 0;
  EXPECT_EQ(read(sent[0], &c, 1), 1);
  close(sent[0]);
  ASSERT_EQ(kill(exporter->pid(), SIGCONT), 0);
  EXPECT_EQ(ExitCode(child), 0);
  EXPECT_NE(Log(*exporter).find("uid 65534 for address " + Hex(h.address) +
                                ": wrong user (peer uid 65534 is not this process's uid 0)"),
            std::string::npos);
  // The exporter keeps serving its own user.
  OpenCheckClose(*importer, handle, kChunk, 8);
}

TEST_F(Fault, SilentPeersOfAnotherUidCannotStallTheExporter) {
  if (geteuid() != 0) {
    GTEST_SKIP() << "needs root to become another user";
  }
  constexpr int kSilent = 10;
  auto exporter = Peer("exporter", "0", {{"VMMIPC_TIMEOUT_MS", "3000"}});
  auto importer = Peer("importer", "1", {{"VMMIPC_TIMEOUT_MS", "10000"}});
  const std::string handle = Handle(*exporter, VmmBuffer(*exporter, "a", 1, 21));
  const ledger::Vmm2Handle h = Decode(handle);
  int ready[2], release[2];
  ASSERT_EQ(pipe2(ready, O_CLOEXEC), 0);
  ASSERT_EQ(pipe2(release, O_CLOEXEC), 0);
  const pid_t child = AsNobody([&] {
    close(release[1]);
    std::vector<int> held;
    for (int i = 0; i < kSilent; ++i) held.push_back(ConnectToRootsName(h));
    (void)!write(ready[1], "r", 1);
    char c;
    (void)!read(release[0], &c, 1);  // silent until the parent is done
    return 0;
  });
  ASSERT_GT(child, 0);
  close(ready[1]);
  close(release[0]);
  char c = 0;
  EXPECT_EQ(read(ready[0], &c, 1), 1);
  close(ready[0]);
  // Queued behind ten silent connections of another user; with the full 3 s
  // each, this open would run out of its own 10 s.
  const auto start = Clock::now();
  const std::string ptr = Value(importer->Call("open " + handle));
  const long elapsed = MsSince(start);
  // The silent peers are dropped after their short grace, while they stay.
  EXPECT_TRUE(
      LogShows(*exporter, "uid 65534: no request (timed out after 50 ms, another user's grace)"));
  close(release[1]);
  EXPECT_EQ(ExitCode(child), 0);
  ASSERT_FALSE(ptr.empty());
  EXPECT_LT(elapsed, 2000);
  EXPECT_EQ(importer->Call("check " + ptr + " " + Hex(kChunk) + " 21"), "ok");
  EXPECT_EQ(importer->Call("close " + ptr), "ok");
}

// Issue 11 / issue 12 item 3: an open waiting on a stopped exporter holds no
// process-wide lock: an open of another exporter's handle and a pointer
// query in the same importer go through at once, and the stuck open itself
// ends within its timeout.
TEST_F(Fault, StoppedExporterDelaysNeitherOtherOpensNorPointerQueries) {
  auto stuck = Peer("exporter", "0");
  auto other = Peer("exporter", "2");
  auto importer = Peer("importer", "1", {{"VMMIPC_TIMEOUT_MS", "2000"}});
  const std::string stuck_handle = Handle(*stuck, VmmBuffer(*stuck, "a", 1, 31));
  const std::string other_handle = Handle(*other, VmmBuffer(*other, "b", 2, 32));
  const std::string earlier = Value(importer->Call("open " + other_handle));
  ASSERT_FALSE(earlier.empty());
  ASSERT_TRUE(StopAndWait(stuck->pid()));
  const auto stuck_start = Clock::now();
  ASSERT_EQ(importer->Call("open_bg " + stuck_handle), "ok");
  // The background open's request is sent: it waits on the stopped exporter.
  EXPECT_TRUE(WaitUntil([&] { return WaitsInPoll(importer->pid(), false); }));
  const auto start = Clock::now();
  EXPECT_TRUE(StartsWith(importer->Call("range " + earlier), "ok "));
  EXPECT_EQ(importer->Call("close " + earlier), "ok");
  const std::string again = Value(importer->Call("open " + other_handle));
  EXPECT_FALSE(again.empty());
  EXPECT_LT(MsSince(start), 1000) << "waited behind the open of the stopped exporter";
  EXPECT_EQ(importer->Call("check " + again + " " + Hex(2 * kChunk) + " 32"), "ok");
  EXPECT_EQ(importer->Call("close " + again), "ok");
  const std::string result = importer->Call("open_bg_result");
  EXPECT_TRUE(StartsWith(result, ErrPrefix(CUDA_ERROR_MAP_FAILED))) << result;
  EXPECT_LT(MsSince(stuck_start), 2000 + 1000) << "the stuck open outlived its timeout";
  kill(stuck->pid(), SIGCONT);
}

// A get has its chunk exported ahead of the first request, once per chunk,
// with the export cache cold (every exported chunk was freed: the driver sets
// its export state up again) or warm: the open then finds an fd to dup and
// exports nothing, and another get of the same chunk exports nothing more.
TEST_F(Fault, GetExportsItsChunkAheadOncePerChunk) {
  auto exporter = Peer("exporter", "0");
  auto importer = Peer("importer", "1");
  OpenCheckClose(*importer, Handle(*exporter, VmmBuffer(*exporter, "a", 1, 41)), kChunk, 41);
  ASSERT_EQ(exporter->Call("free_vmm a"), "ok");  // its cached fd closes: the cache is empty
  // Counts are taken at rest: the reply's fds and connection close just
  // after the importer has its answer, and exports ahead run on a worker.
  const uint64_t b = VmmBuffer(*exporter, "b", 1, 42);
  const int fds_before_get = RestingFdsOf(exporter->pid());
  const std::string handle = Handle(*exporter, b);
  EXPECT_EQ(RestingFdsOf(exporter->pid()), fds_before_get + 1)
      << "no export ahead of the first request (cold cache)";
  OpenCheckClose(*importer, handle, kChunk, 42);
  EXPECT_EQ(RestingFdsOf(exporter->pid()), fds_before_get + 1) << "the open did not use it";
  const uint64_t c = VmmBuffer(*exporter, "c", 1, 43);
  const int warm = RestingFdsOf(exporter->pid());
  (void)Handle(*exporter, c);
  EXPECT_EQ(RestingFdsOf(exporter->pid()), warm + 1) << "no export ahead with a warm cache";
  (void)Handle(*exporter, c);
  EXPECT_EQ(RestingFdsOf(exporter->pid()), warm + 1) << "a second get of the chunk exported again";
}

// VMMIPC_EXPORT_IN_GET: by default get exports its chunk before it returns
// (so that no export runs while peers import the handle); with 0 it returns
// at once and a listener worker exports. The simulator holds the export for
// a second: get's time says on which side of it the handle left.
TEST_F(Fault, GetExportsItsChunkBeforeItReturnsUnlessToldToQueueIt) {
  if (!Sim()) GTEST_SKIP() << "needs the simulator's injected delay";
  for (const char* in_get : {"1", "0"}) {
    SCOPED_TRACE(std::string("VMMIPC_EXPORT_IN_GET=") + in_get);
    auto exporter = Peer(std::string("exporter") + in_get, "0", {{"VMMIPC_EXPORT_IN_GET", in_get}});
    auto importer = Peer(std::string("importer") + in_get, "1");
    // The process's first export (and its warm-up) done first.
    OpenCheckClose(*importer, Handle(*exporter, VmmBuffer(*exporter, "warm", 1, 44)), kChunk, 44);
    const uint64_t base = VmmBuffer(*exporter, "a", 1, 45);
    const int fds_before_get = RestingFdsOf(exporter->pid());
    ASSERT_EQ(exporter->Call("inject_delay cuMemExportToShareableHandle 1 1000"), "ok");
    const auto start = Clock::now();
    const std::string handle = Handle(*exporter, base);
    const int64_t get_ms = MsSince(start);
    if (std::string(in_get) == "1") {
      EXPECT_GE(get_ms, 1000) << "get returned before its chunk was exported";
      EXPECT_EQ(FdsOf(exporter->pid()), fds_before_get + 1) << "not exported when get returned";
    } else {
      EXPECT_LT(get_ms, 800) << "get waited for the export";
      // The worker sleeps in the held export: "at rest" would not wait for it.
      EXPECT_TRUE(WaitUntil([&] { return FdsOf(exporter->pid()) == fds_before_get + 1; }))
          << "the worker did not export it";
    }
    EXPECT_EQ(RestingFdsOf(exporter->pid()), fds_before_get + 1) << "one export, kept";
    OpenCheckClose(*importer, handle, kChunk, 45);
    EXPECT_EQ(RestingFdsOf(exporter->pid()), fds_before_get + 1) << "the open exported again";
  }
}

// An export that fails in get costs the get nothing: the handle is made, and
// the chunk is exported when its first request comes.
TEST_F(Fault, AnExportThatFailsInGetIsDoneAtTheFirstRequest) {
  if (!Sim()) GTEST_SKIP() << "needs the simulator's injected failure";
  auto exporter = Peer("exporter", "0");
  auto importer = Peer("importer", "1");
  OpenCheckClose(*importer, Handle(*exporter, VmmBuffer(*exporter, "warm", 1, 46)), kChunk, 46);
  const uint64_t base = VmmBuffer(*exporter, "a", 1, 47);
  const int fds_before_get = RestingFdsOf(exporter->pid());
  ASSERT_TRUE(Inject(*exporter, "cuMemExportToShareableHandle", 1, CUDA_ERROR_OUT_OF_MEMORY));
  const std::string handle = Handle(*exporter, base);
  ASSERT_FALSE(handle.empty());
  EXPECT_EQ(RestingFdsOf(exporter->pid()), fds_before_get) << "nothing kept of the failed export";
  OpenCheckClose(*importer, handle, kChunk, 47);
  EXPECT_EQ(RestingFdsOf(exporter->pid()), fds_before_get + 1) << "exported at the request";
}

// Opens no longer share one process-wide lock: threads opening one handle
// at once must still agree on one pointer (the contract: the same handle
// opened again is the same pointer), for an unranked exporter too, whose
// placement is not a zone slot. Everything is closed again after.
TEST_F(Fault, ThreadsOpeningOneHandleAtOnceGetOnePointer) {
  for (const char* rank : {"0", ""}) {
    auto exporter = Peer("exporter", rank);
    auto importer = Peer("importer", "1");
    const std::string handle = Handle(*exporter, VmmBuffer(*exporter, "a", 3, 51));
    OpenCheckClose(*importer, handle, 3 * kChunk, 51);  // the zone exists from here on
    const Resources before = Held(*importer);
    for (int round = 0; round < 5; ++round)
      EXPECT_EQ(importer->Call("same_open 8 " + handle), "ok 1") << "rank '" << rank << "'";
    EXPECT_EQ(Held(*importer), before) << "rank '" << rank << "'";
  }
}

TEST_F(Fault, ImporterOfAnotherUidFindsNoExporterUnderItsOwnUidsName) {
  if (geteuid() != 0) {
    GTEST_SKIP() << "needs root to become another user";
  }
  auto exporter = Peer("exporter", "0");
  auto importer = Peer("importer", "1");
  const std::string handle = Handle(*exporter, VmmBuffer(*exporter, "a", 1, 9));
  ASSERT_EQ(importer->Call("drop_to 65534"), "ok");
  const Resources before = Held(*importer);
  EXPECT_TRUE(StartsWith(importer->Call("open " + handle), ErrPrefix(CUDA_ERROR_INVALID_HANDLE)));
  EXPECT_NE(Log(*importer).find("nobody listens on @" + AbstractNameOf(Decode(handle), 65534)),
            std::string::npos);
  EXPECT_EQ(Held(*importer), before);
  EXPECT_EQ(Log(*exporter).find("refused peer"), std::string::npos);
}

TEST_F(Fault, SquatterOfAnotherUidGetsNotEvenTheRequest) {
  if (geteuid() != 0) {
    GTEST_SKIP() << "needs root to become another user";
  }
  auto exporter = Peer("exporter", "0");
  auto importer = Peer("importer", "1");
  const std::string handle = Handle(*exporter, VmmBuffer(*exporter, "a", 1, 9));
  const ledger::Vmm2Handle h = Decode(handle);
  exporter->Kill();
  // Another user binds our uid's name for the dead pid (abstract names are
  // not access-checked) and reports whether a request ever reached it.
  int ready[2];
  ASSERT_EQ(pipe2(ready, O_CLOEXEC), 0);
  const pid_t child = fork();
  if (child == 0) {
    alarm(20);
    if (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 ||
        setresuid(65534, 65534, 65534) != 0)
      _exit(20);
    const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string name = AbstractNameOf(h, 0);  // root's (the test's) name for that exporter
    std::memcpy(addr.sun_path + 1, name.data(), name.size());
    const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    if (bind(fd, reinterpret_cast<const sockaddr*>(&addr), length) != 0 || listen(fd, 4) != 0)
      _exit(21);
    (void)!write(ready[1], "r", 1);
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 10000) <= 0) _exit(22);
    const int conn = accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
    pollfd r{conn, POLLIN, 0};
    char buf[128];
    // Nothing may arrive; EOF (the importer hung up) is the expected end.
    if (poll(&r, 1, 5000) <= 0) _exit(23);
    _exit(recv(conn, buf, sizeof(buf), 0) == 0 ? 0 : 24);
  }
  ASSERT_GT(child, 0);
  close(ready[1]);
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  close(ready[0]);
  const Resources before = Held(*importer);
  EXPECT_TRUE(StartsWith(importer->Call("open " + handle), ErrPrefix(CUDA_ERROR_NOT_PERMITTED)));
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "squatter status " << status;
  EXPECT_NE(Log(*importer).find("of uid 65534, not by our uid 0; returning "
                                "CUDA_ERROR_NOT_PERMITTED"),
            std::string::npos);
  EXPECT_EQ(Held(*importer), before);
}

// Regression (issue 12, item 4): torn runs. An exporter that frees and
// re-creates a two-chunk buffer at the same address while a request for it
// is being served must never grant chunk 0 of the handle's memory with chunk
// 1 of the new one. The simulator holds the export of chunk 1 for a second
// (the exported-fd cache is warm, so chunk 0 is exported first, on the
// request's own path); meanwhile the buffer is re-created with other bytes.
// Before the fix the grant went out torn and the open succeeded; now the run
// is revalidated after exporting and the open fails cleanly.
TEST_F(Fault, MemoryReCreatedWhileItsRunIsServedIsRefusedNeverTorn) {
  if (!Sim()) GTEST_SKIP() << "needs the simulator's injected delay";
  auto exporter = Peer("exporter", "0");
  auto importer = Peer("importer", "1");
  // The listener started and settled first, so that the get below adds one fd.
  OpenCheckClose(*importer, Handle(*exporter, VmmBuffer(*exporter, "warm", 1, 29)), kChunk, 29);
  const uint64_t base = VmmBuffer(*exporter, "a", 2, 30);
  const int fds_before_get = RestingFdsOf(exporter->pid());
  const std::string handle = Handle(*exporter, base);
  // The get exports chunk 0 ahead; once it is cached, the request's only
  // export is chunk 1's, which waits.
  const int armed = RestingFdsOf(exporter->pid());
  ASSERT_EQ(armed, fds_before_get + 1) << "chunk 0 was not exported ahead";
  const Resources before = Held(*importer);
  ASSERT_EQ(exporter->Call("inject_delay cuMemExportToShareableHandle 1 1000"), "ok");
  ASSERT_EQ(importer->Call("open_bg " + handle), "ok");
  // The request is in (its connection) and chunk 0 dup'ed for it: chunk 1's
  // export, the next step, waits.
  ASSERT_TRUE(WaitUntil([&] { return FdsOf(exporter->pid()) == armed + 2; }))
      << FdsOf(exporter->pid()) << " fds in the exporter, " << armed << " + 2 expected";
  ASSERT_EQ(exporter->Call("free_vmm a"), "ok");
  ASSERT_EQ(VmmBuffer(*exporter, "a", 2, 31), base) << "re-created elsewhere: no race to test";
  const std::string result = importer->Call("open_bg_result", 20000);
  EXPECT_TRUE(StartsWith(result, ErrPrefix(CUDA_ERROR_INVALID_HANDLE))) << result;
  EXPECT_TRUE(LogShows(*exporter, "freed"));
  EXPECT_EQ(Settled(*importer, before), before);
  // The new memory, through its own handle: whole, with its own bytes.
  OpenCheckClose(*importer, Handle(*exporter, base), 2 * kChunk, 31);
}

// Regression (issue 12, items 6 and 7): a handle is a capability for exactly
// what it names. Before, the exporter served any handle carrying its
// process-wide token: rank 0's handle with its rank field set to 1 mapped
// into rank 1's slot (and pushed rank 1's genuine memory to best-effort), and
// a handle edited to name another mapped chunk of the exporter was served.
TEST_F(Fault, EditedHandlesAreRefusedAndTakeNoSlot) {
  auto exporter = Peer("exporter", "0");
  auto rank1 = Peer("rank1", "1");
  auto importer = Peer("importer", "3");
  const std::string a = Handle(*exporter, VmmBuffer(*exporter, "a", 1, 20));
  const std::string b = Handle(*exporter, VmmBuffer(*exporter, "b", 2, 21));
  const std::string genuine_rank1 = Handle(*rank1, VmmBuffer(*rank1, "c", 1, 22));
  const Resources before = Held(*importer);
  std::vector<std::pair<std::string, ledger::Vmm2Handle>> edits;
  ledger::Vmm2Handle h = Decode(a);
  h.rank_slot = 1;  // into rank 1's slot
  edits.emplace_back("rank slot", h);
  h = Decode(a);
  h.rank_slot = ledger::kUnranked;
  edits.emplace_back("rank slot to unranked", h);
  h = Decode(a);
  h.region_base = h.chunk_base - kChunk;  // another place in the slot
  edits.emplace_back("region base", h);
  // Buffer b's chunk, its generation known from b's own handle, under a's
  // capability: what a holder of a alone should never reach.
  const ledger::Vmm2Handle hb = Decode(b);
  h = Decode(a);
  h.address = h.chunk_base = hb.chunk_base;
  h.chunk_size = hb.chunk_size;
  h.region_base = hb.region_base;
  h.generation = hb.generation;
  edits.emplace_back("another chunk", h);
  h = Decode(b);
  h.address = h.chunk_base = hb.chunk_base + kChunk;  // b's second chunk
  h.generation += 1;
  edits.emplace_back("the next chunk, next generation", h);
  h = Decode(a);
  h.chunk_size *= 2;
  edits.emplace_back("chunk size", h);
  for (const auto& [what, edited] : edits) {
    SCOPED_TRACE(what);
    EXPECT_TRUE(
        StartsWith(importer->Call("open " + Encode(edited)), ErrPrefix(CUDA_ERROR_INVALID_HANDLE)));
  }
  EXPECT_EQ(Settled(*importer, before), before);
  EXPECT_TRUE(LogShows(*exporter, "bad token (request MAC does not verify for pid"));
  // Rank 1's own memory still lands in its slot, and the genuine handles work.
  EXPECT_EQ(importer->Call("open " + genuine_rank1), "ok " + Hex(kZoneBase + 1 * kSlotSize));
  OpenCheckClose(*importer, a, kChunk, 20);
  OpenCheckClose(*importer, b, 2 * kChunk, 21);
}

TEST_F(Fault, StaleTokenAsAfterPidReuseIsRefusedAsInvalidHandle) {
  auto exporter = Peer("exporter", "0");
  auto other = Peer("other", "2");
  auto importer = Peer("importer", "1");
  const std::string handle = Handle(*exporter, VmmBuffer(*exporter, "a", 1, 10));
  (void)Handle(*other, VmmBuffer(*other, "b", 1, 11));  // `other` listens too
  const Resources before = Held(*importer);
  // The same pid with another capability (a new process that got the pid),
  // and a handle whose instance (its socket's name) is another live vmmipc
  // process's.
  ledger::Vmm2Handle stale = Decode(handle);
  stale.capability ^= 0x1;
  ledger::Vmm2Handle reused = Decode(handle);
  reused.instance = Decode(Handle(*other, VmmBuffer(*other, "c", 1, 12))).instance;
  for (const ledger::Vmm2Handle& h : {stale, reused}) {
    EXPECT_TRUE(
        StartsWith(importer->Call("open " + Encode(h)), ErrPrefix(CUDA_ERROR_INVALID_HANDLE)));
  }
  EXPECT_EQ(Settled(*importer, before), before);
  EXPECT_NE(Log(*importer).find("refused the handle's token (unverified answer"),
            std::string::npos);
  EXPECT_NE(Log(*exporter).find("bad token (request MAC does not verify"), std::string::npos);
  EXPECT_NE(Log(*other).find("bad token (request MAC does not verify"), std::string::npos);
  // The genuine handle still works.
  OpenCheckClose(*importer, handle, kChunk, 10);
}

TEST_F(Fault, SilentPeerDelaysNobodyAndIsDroppedAtTheExportersTimeout) {
  auto exporter = Peer("exporter", "0", {{"VMMIPC_TIMEOUT_MS", "1000"}});
  auto importer = Peer("importer", "1", {{"VMMIPC_TIMEOUT_MS", "5000"}});
  const std::string handle = Handle(*exporter, VmmBuffer(*exporter, "a", 1, 12));
  const int idle = RestingFdsOf(exporter->pid());  // the get's export ahead done
  const int silent = ConnectTo(Decode(handle));
  ASSERT_GE(silent, 0);
  // Accepted (one more fd there): the listener now waits for its request.
  EXPECT_TRUE(WaitUntil([&] { return FdsOf(exporter->pid()) == idle + 1; }));
  const auto start = Clock::now();
  const std::string ptr = Value(importer->Call("open " + handle));
  const long elapsed = MsSince(start);
  EXPECT_FALSE(ptr.empty());
  // The listener reads requests of many connections at once: the open does
  // not wait for the silent peer's timeout (1 s) at all.
  EXPECT_LT(elapsed, 900) << "the open waited behind the silent peer";
  EXPECT_EQ(ReplyStatus(silent, 3000), -1) << "the silent peer was dropped without an answer";
  close(silent);
  EXPECT_TRUE(LogShows(*exporter, "no request (timed out after 1000 ms)"));
  EXPECT_EQ(importer->Call("check " + ptr + " " + Hex(kChunk) + " 12"), "ok");
  EXPECT_EQ(importer->Call("close " + ptr), "ok");
}

// Issue 36 item 4: 1,100 watch fetches of one handle from one process, each
// under a new follower id, were kept until the exporter's watch budget (a
// quarter of its free fds: 9 -> 263 fds of 1024). One process now keeps at
// most Watchers::kMaxWatchersPerProcess (4) watch connections (by its
// SO_PEERCRED pid); the rest of its fetches are answered without one. The
// exporter's fds are counted at rest, with the watch connections it keeps.
TEST_F(Fault, OneProcessWithAThousandFollowerIdsKeepsAFewWatchConnections) {
  constexpr int kWatches = 1100;
  constexpr int kPerProcess = 4;  // transport::Watchers::kMaxWatchersPerProcess
  auto exporter = Peer("exporter", "0", {{"VMMIPC_FOLLOW", "1"}});
  auto raw = Peer("raw", "", {}, {}, /*preload=*/false);  // raw_follower.h
  ASSERT_TRUE(exporter && raw);
  const std::string handle = Handle(*exporter, VmmBuffer(*exporter, "a", 1, 3));
  const int before = RestingFdsOf(exporter->pid());

  const std::string answer =
      raw->Call("raw_watches " + handle + " 0x7000 " + std::to_string(kWatches), 60000);
  ASSERT_EQ(answer, "ok " + std::to_string(kWatches)) << "every fetch is granted";
  // At rest with the watch connections it keeps: kPerProcess of them (before,
  // it never came to rest with so few).
  const int after = RestingFdsOf(exporter->pid(), 10000, kPerProcess);
  std::cout << "exporter fds at rest: " << before << " before, " << after << " after " << kWatches
            << " watch fetches of one process under new follower ids (" << FdsOf(exporter->pid())
            << " now, " << AcceptedConnectionsOf(exporter->pid())
            << " watch connections kept; bound " << before << " + " << kPerProcess << ")\n";
  EXPECT_EQ(AcceptedConnectionsOf(exporter->pid()), kPerProcess);
  EXPECT_EQ(after, before + kPerProcess);
  EXPECT_TRUE(LogShows(*exporter, "watch connections already, under other follower ids"));
  // The process's exit gives them back.
  raw.reset();
  EXPECT_EQ(RestingFdsOf(exporter->pid()), before);
}

TEST_F(Fault, TruncatedMalformedOrFdCarryingRequestsAreDroppedAndTheExporterKeepsServing) {
  auto exporter = Peer("exporter", "0", {{"VMMIPC_TIMEOUT_MS", "1000"}});
  auto importer = Peer("importer", "1");
  const std::string handle = Handle(*exporter, VmmBuffer(*exporter, "a", 1, 13));
  const ledger::Vmm2Handle h = Decode(handle);
  // Served once first, so that the chunk's exported fd is in the exporter's
  // cache (kept until the chunk is unmapped) before its fds are counted.
  OpenCheckClose(*importer, handle, kChunk, 13);
  const int exporter_fds = RestingFdsOf(exporter->pid());  // the reply's own fds closed
  const std::vector<uint8_t> request = RawRequest(h);

  // Half a request: too short for a preamble, so there is no nonce to answer with.
  int fd = ConnectTo(h);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(send(fd, request.data(), 20, MSG_NOSIGNAL), 20);
  EXPECT_EQ(ReplyStatus(fd, 2000), -1);
  close(fd);
  // A preamble and nothing else: refused as a bad request.
  fd = ConnectTo(h);
  ASSERT_EQ(send(fd, request.data(), 40, MSG_NOSIGNAL), 40);
  EXPECT_EQ(ReplyStatus(fd, 2000), 8);  // kBadRequest
  close(fd);
  bool fd_request_sent = false;
  // A whole request carrying an fd: never taken. With SO_PASSRIGHTS (Linux
  // 6.16+) the kernel refuses the send; elsewhere the exporter leaves the
  // message queued and its reaper closes the connection (the peer sees a
  // reset, no answer). Either way the fd is not kept.
  fd = ConnectTo(h);
  {
    const int memfd = memfd_create("unwanted", MFD_CLOEXEC);
    const ssize_t sent = SendWithFd(fd, request.data(), request.size(), memfd);
    const int send_error = errno;
    close(memfd);
    fd_request_sent = sent >= 0;
    if (sent < 0) {
      EXPECT_EQ(send_error, EPERM);
    } else {
      EXPECT_EQ(sent, 80);
      EXPECT_EQ(ReplyStatus(fd, 2000), -1);
    }
  }
  close(fd);
  // Connect and hang up at once.
  fd = ConnectTo(h);
  close(fd);
  // A request with a wrong MAC: bad token.
  fd = ConnectTo(h);
  ASSERT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL), 80);
  EXPECT_EQ(ReplyStatus(fd, 2000), 1);  // kBadToken
  close(fd);

  OpenCheckClose(*importer, handle, kChunk, 13);
  const std::string log = Log(*exporter);
  EXPECT_NE(log.find("not a vmmipc request (too short)"), std::string::npos);
  EXPECT_NE(log.find("bad request (request version 2, 40 bytes: bad length)"), std::string::npos);
  if (fd_request_sent) {
    EXPECT_NE(log.find("bad request (the request carried fds)"), std::string::npos);
  }
  EXPECT_NE(log.find("no request (peer closed the connection)"), std::string::npos);
  // The connection that carried an fd is closed by the exporter's reaper thread.
  EXPECT_EQ(RestingFdsOf(exporter->pid()), exporter_fds) << "the exporter kept a descriptor";
}

// VMMIPC_SOCKET_DIR must be private to the user: in a directory others can
// write (/dev/shm and /tmp are mode 1777) another user could create the
// socket names first. The exporter's listener does not start there, and an
// importer that finds the directory so does not connect; both say why.
TEST_F(Fault, SocketDirectoryOthersCanWriteIsRefusedByExporterAndImporter) {
  char dir_template[] = "/tmp/vmmipc-fault-dir-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const std::map<std::string, std::string> env = {{"VMMIPC_SOCKET_DIR", dir}};
  ASSERT_EQ(chmod(dir.c_str(), 01777), 0);
  {
    auto exporter = Peer("exporter-in-shared-dir", "0", env);
    const uint64_t base = VmmBuffer(*exporter, "a", 1, 40);
    EXPECT_TRUE(
        StartsWith(exporter->Call("get " + Hex(base)), ErrPrefix(CUDA_ERROR_OPERATING_SYSTEM)));
    EXPECT_NE(Log(*exporter).find("cannot start the export listener: socket directory '" + dir +
                                  "' is writable by group and others (mode 1777)"),
              std::string::npos);
  }
  ASSERT_EQ(chmod(dir.c_str(), 0700), 0);
  {
    auto exporter = Peer("exporter", "0", env);
    auto importer = Peer("importer", "1", env);
    const std::string handle = Handle(*exporter, VmmBuffer(*exporter, "b", 2, 41));
    ASSERT_EQ(chmod(dir.c_str(), 0777), 0);
    EXPECT_TRUE(StartsWith(importer->Call("open " + handle), ErrPrefix(CUDA_ERROR_INVALID_HANDLE)));
    EXPECT_NE(Log(*importer).find("socket directory '" + dir +
                                  "' is writable by group and others (mode 0777): another user "
                                  "could create socket names in it"),
              std::string::npos);
    ASSERT_EQ(chmod(dir.c_str(), 0700), 0);
    OpenCheckClose(*importer, handle, 2 * kChunk, 41);
  }
  std::filesystem::remove_all(dir);
}

// Issue 26 item 7: with VMMIPC_SOCKET_DIR every exporter that exited left its
// socket file behind (five exits, five files). Now an exporter that exits,
// by exit() or by returning from main, removes it; one killed (SIGKILL: no
// exit handler runs) leaves it, and the next exporter of that name finds it
// dead, removes it and serves.
TEST_F(Fault, SocketFileGoesWithAnExporterThatExitsAndAKilledOnesIsTakenOverByItsName) {
  char dir_template[] = "/tmp/vmmipc-fault-exit-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const std::map<std::string, std::string> env = {{"VMMIPC_SOCKET_DIR", dir}};
  auto path_of = [&](const std::string& handle) {
    return dir + "/" + AbstractNameOf(Decode(handle)) + ".sock";
  };
  auto files = [&] {
    size_t n = 0;
    for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir)) ++n;
    return n;
  };
  // exit(), then a return from main (what the peer does at its "exit").
  for (const bool by_exit : {true, false}) {
    auto exporter = Peer(by_exit ? "exporter-exit" : "exporter-return", "0", env);
    const std::string path = path_of(Handle(*exporter, VmmBuffer(*exporter, "a", 1, 42)));
    ASSERT_TRUE(std::filesystem::exists(path)) << path;
    if (by_exit) {
      // No answer: its stdout closes when it has exited, exit handlers run.
      EXPECT_EQ(exporter->Call("exit_now 0"), "");
      exporter->Kill();  // only reaps it: writing it "exit" now would raise SIGPIPE here
    }
    exporter.reset();  // for the return: asks it to exit, and reaps it
    EXPECT_FALSE(std::filesystem::exists(path)) << (by_exit ? "exit()" : "return from main");
  }
  EXPECT_EQ(files(), 0u);
  auto killed = Peer("exporter-killed", "0", env);
  const std::string stale = path_of(Handle(*killed, VmmBuffer(*killed, "b", 1, 43)));
  killed->Kill();
  EXPECT_TRUE(std::filesystem::exists(stale)) << "a killed exporter runs no exit handler";
  EXPECT_EQ(files(), 1u);
  // The next exporter in the directory: no other process has the dead one's
  // name (an instance id is random), so the first listener to start there
  // removes every socket file of this uid that nobody listens on.
  auto next = Peer("exporter-next", "0", env);
  auto importer = Peer("importer", "1", env);
  const std::string handle = Handle(*next, VmmBuffer(*next, "c", 1, 44));
  EXPECT_TRUE(LogShows(*next, "removed stale socket file " + stale));
  EXPECT_FALSE(std::filesystem::exists(stale));
  OpenCheckClose(*importer, handle, kChunk, 44);
  next.reset();
  importer.reset();
  EXPECT_EQ(files(), 0u);
  std::filesystem::remove_all(dir);
}

// --- resources of the importer ----------------------------------------------------------------

TEST_F(Fault, NearlyExhaustedFdLimitFailsOpenCleanlyThenOpenRecovers) {
  auto exporter = Peer("exporter", "0");
  auto importer = Peer("importer", "1");
  const std::string handle = Handle(*exporter, VmmBuffer(*exporter, "a", 4, 14));
  OpenCheckClose(*importer, handle, 4 * kChunk, 14);
  const Resources before = Held(*importer);
  int failures = 0, successes = 0;
  for (int free_fds = 0; free_fds <= 10; ++free_fds) {
    ASSERT_TRUE(StartsWith(importer->Call("headroom " + std::to_string(free_fds)), "ok "));
    const std::string result = importer->Call("open " + handle);
    if (StartsWith(result, "ok ")) {
      ++successes;
      EXPECT_EQ(importer->Call("check " + Value(result) + " " + Hex(4 * kChunk) + " 14"), "ok");
      EXPECT_EQ(importer->Call("close " + Value(result)), "ok");
    } else {
      ++failures;
      // Out of descriptors is the host's condition, not a bad handle.
      EXPECT_TRUE(StartsWith(result, ErrPrefix(CUDA_ERROR_OPERATING_SYSTEM)) ||
                  StartsWith(result, ErrPrefix(CUDA_ERROR_OUT_OF_MEMORY)))
          << free_fds << " free fds: " << result;
    }
    ASSERT_TRUE(StartsWith(importer->Call("nofile_max"), "ok "));
    // Settled: a failed open hands what it received to the reaper, whose
    // threads start (and name themselves) a moment later.
    EXPECT_EQ(Settled(*importer, before), before) << free_fds << " free fds";
  }
  EXPECT_GT(failures, 0);
  EXPECT_GT(successes, 0);
  EXPECT_NE(Log(*importer).find("returning CUDA_ERROR_OPERATING_SYSTEM"), std::string::npos);
}

TEST_F(Fault, TakenZoneAndFallbackPlaceBestEffortSayWhyAndFreeTheReservation) {
  auto exporter = Peer("exporter", "0");
  auto importer = Peer("importer", "1", {{"VMMIPC_ZONE_FALLBACK_BASE", Hex(kFallbackBase)}});
  const std::string handle = Handle(*exporter, VmmBuffer(*exporter, "a", 2, 15));
  ASSERT_EQ(importer->Call("occupy " + Hex(kZoneBase) + " " + Hex(kChunk)), "ok");
  ASSERT_EQ(importer->Call("occupy " + Hex(kFallbackBase + kChunk) + " " + Hex(kChunk)), "ok");
  const Resources before = Held(*importer);
  const uint64_t ptr = Num(Value(importer->Call("open " + handle)));
  ASSERT_NE(ptr, 0u);
  EXPECT_TRUE(ptr < kZoneBase || ptr >= kFallbackBase + kSlots * kSlotSize) << Hex(ptr);
  EXPECT_EQ(importer->Call("check " + Hex(ptr) + " " + Hex(2 * kChunk) + " 15"), "ok");
  EXPECT_EQ(importer->Call("close " + Hex(ptr)), "ok");
  EXPECT_EQ(Held(*importer), before);
  const std::string log = Log(*importer);
  EXPECT_NE(log.find("no import zone (tried " + Hex(kZoneBase) + " and " + Hex(kFallbackBase)),
            std::string::npos);
  EXPECT_NE(log.find("best-effort, not at a deterministic address: there is no import zone"),
            std::string::npos);
}

TEST_F(Fault, RunBeyondItsSlotIsPlacedBestEffortWithCorrectData) {
  // 16 slots of 8 MiB: a 4 MiB buffer at offset 0 fits rank 0's slot, a 16 MiB one does not.
  auto exporter = Peer("exporter", "0");
  auto importer =
      Peer("importer", "1", {{"VMMIPC_SLOT_SIZE", "0x800000"}, {"VMMIPC_ZONE_SLOTS", "16"}});
  const uint64_t small = VmmBuffer(*exporter, "small", 2, 16);
  const uint64_t large = VmmBuffer(*exporter, "large", 8, 17);
  const std::string small_handle = Handle(*exporter, small);
  const std::string large_handle = Handle(*exporter, large + 7 * kChunk);
  const ledger::Vmm2Handle s = Decode(small_handle);
  ASSERT_EQ(s.chunk_base, s.region_base) << "the small buffer starts its region";

  const uint64_t small_ptr = Num(Value(importer->Call("open " + small_handle)));
  EXPECT_EQ(small_ptr, kZoneBase);  // rank 0, offset 0
  const uint64_t large_ptr = Num(Value(importer->Call("open " + large_handle)));
  ASSERT_NE(large_ptr, 0u);
  EXPECT_TRUE(large_ptr < kZoneBase || large_ptr >= kZoneBase + 16 * 0x800000ull) << Hex(large_ptr);
  EXPECT_EQ(
      importer->Call("check " + Hex(large_ptr) + " " + Hex(kChunk) + " 17 " + Hex(7 * kChunk)),
      "ok");
  EXPECT_NE(Log(*importer).find("the run does not fit the exporter's slot"), std::string::npos);
  EXPECT_EQ(importer->Call("close " + Hex(large_ptr)), "ok");
  EXPECT_EQ(importer->Call("close " + Hex(small_ptr)), "ok");
  if (Sim()) {
    EXPECT_EQ(Held(*importer).mappings, 1);  // the page-table anchor of the stretch it used
  }
}

// --- driver failures (simulated driver) ----------------------------------------------------

struct Injection {
  const char* side;  // "importer" or "exporter"
  const char* function;
  unsigned nth;
  CUresult expected;  // what the importer's cuIpcOpenMemHandle returns
  const char* log;    // a line the failing side writes
};

void PrintTo(const Injection& in, std::ostream* out) {
  *out << in.side << " " << in.function << " call " << in.nth;
}

class DriverFailure : public Fault, public ::testing::WithParamInterface<Injection> {};

TEST_P(DriverFailure, FailsOpenWithAClearCodeAndLeavesNothingBehind) {
  if (!Sim()) {
    GTEST_SKIP() << "fault injection needs the simulated driver";
  }
  const Injection& in = GetParam();
  auto exporter = Peer("exporter", "0");
  auto importer = Peer("importer", "1");
  const std::string warm = Handle(*exporter, VmmBuffer(*exporter, "warm", 1, 18));
  OpenCheckClose(*importer, warm, kChunk, 18);  // the zone exists from here on
  // (The exporter closes the reply's fds and connection a moment after the
  // importer has its answer: each count waits for that.)
  const int exporter_fds_without_a = RestingFdsOf(exporter->pid());
  const uint64_t a = VmmBuffer(*exporter, "a", 3, 19);
  const int fds_before_get = RestingFdsOf(exporter->pid());
  const std::string handle = Handle(*exporter, a);
  // The get exports chunk 0 ahead on a listener worker: let it finish, so
  // that the injected failure hits the request's own driver calls.
  EXPECT_EQ(RestingFdsOf(exporter->pid()), fds_before_get + 1);
  const Resources importer_before = Held(*importer);
  const Resources exporter_before = Held(*exporter);

  PeerProcess& side = std::string(in.side) == "importer" ? *importer : *exporter;
  ASSERT_TRUE(Inject(side, in.function, static_cast<int>(in.nth), CUDA_ERROR_OUT_OF_MEMORY));
  const std::string result = importer->Call("open " + handle);
  EXPECT_TRUE(StartsWith(result, ErrPrefix(in.expected))) << result;
  EXPECT_NE(Log(side).find(in.log), std::string::npos) << in.log;
  EXPECT_EQ(Held(*importer), importer_before);
  // The exporter keeps the exported fd of every chunk it served (its cache),
  // until the chunk is unmapped; nothing else.
  // (The exporter closes its copies of the sent fds and the connection just
  // after the importer has its answer: wait for that.)
  Resources exporter_now = Held(*exporter);
  for (int i = 0; i < 200 && exporter_now.fds > exporter_before.fds + 3; ++i) {
    usleep(10000);
    exporter_now = Held(*exporter);
  }
  EXPECT_LE(exporter_now.fds, exporter_before.fds + 3);
  exporter_now.fds = exporter_before.fds;
  EXPECT_EQ(exporter_now, exporter_before);
  // Nothing half-recorded either: the next open maps all three chunks afresh.
  OpenCheckClose(*importer, handle, 3 * kChunk, 19);
  EXPECT_EQ(Held(*importer), importer_before);
  // Unmapping the buffer closes its cached fds: the exporter is back to
  // where it was before the buffer existed.
  EXPECT_EQ(exporter->Call("free_vmm a"), "ok");
  EXPECT_EQ(RestingFdsOf(exporter->pid()), exporter_fds_without_a);
}

INSTANTIATE_TEST_SUITE_P(
    Injected, DriverFailure,
    ::testing::Values(Injection{"importer", "cuMemImportFromShareableHandle", 2,
                                CUDA_ERROR_OUT_OF_MEMORY,
                                "MemImportFromShareableHandle failed: CUDA_ERROR_OUT_OF_MEMORY"},
                      Injection{"importer", "cuMemMap", 3, CUDA_ERROR_OUT_OF_MEMORY,
                                "of an imported chunk failed: CUDA_ERROR_OUT_OF_MEMORY"},
                      Injection{"importer", "cuMemSetAccess", 1, CUDA_ERROR_OUT_OF_MEMORY,
                                "failed: CUDA_ERROR_OUT_OF_MEMORY"},
                      Injection{"exporter", "cuMemExportToShareableHandle", 2,
                                CUDA_ERROR_MAP_FAILED,
                                "export failed (cuMemExportToShareableHandle("},
                      // Tracked memory is described from the mapping table; a chunk whose
                      // allocation cannot be retained cannot be exported.
                      Injection{"exporter", "cuMemRetainAllocationHandle", 1, CUDA_ERROR_MAP_FAILED,
                                "MemRetainAllocationHandle failed"}),
    [](const ::testing::TestParamInfo<Injection>& info) {
      return std::string(info.param.side) + "_" + info.param.function + "_" +
             std::to_string(info.param.nth);
    });

TEST_F(Fault, FailedBestEffortReservationFailsOpenAndLeavesNothing) {
  if (!Sim()) {
    GTEST_SKIP() << "fault injection needs the simulated driver";
  }
  auto exporter = Peer("exporter", "");  // unranked: best-effort, one reservation per run
  auto importer = Peer("importer", "1");
  const std::string handle = Handle(*exporter, VmmBuffer(*exporter, "a", 2, 20));
  const Resources before = Held(*importer);
  ASSERT_TRUE(Inject(*importer, "cuMemAddressReserve", 1, CUDA_ERROR_OUT_OF_MEMORY));
  EXPECT_TRUE(StartsWith(importer->Call("open " + handle), ErrPrefix(CUDA_ERROR_OUT_OF_MEMORY)));
  EXPECT_EQ(Held(*importer), before);
  OpenCheckClose(*importer, handle, 2 * kChunk, 20);
  EXPECT_EQ(Held(*importer), before);
}

// VMMIPC_CUDA_LIBRARY naming libvmmipc.so itself hands vmmipc its own hooks
// as "the driver": each would call itself until the stack overflowed. It is
// refused like a driver that cannot be loaded: every hooked call fails with
// CUDA_ERROR_NOT_SUPPORTED, the process lives on, one error line says why.
TEST_F(Fault, DriverThatIsVmmipcItselfIsRefusedLikeAMissingOne) {
  const std::string zeros(128, '0');  // a handle vmmipc does not know: the driver's to answer
  struct Case {
    std::string library;
    std::string log;
  };
  for (const Case& c :
       {Case{VMMIPC_LIBRARY_PATH, std::string("refusing the CUDA driver '") + VMMIPC_LIBRARY_PATH +
                                      "': its cuIpcGetMemHandle is vmmipc's own ("},
        Case{"libvmmipc.so", "refusing the CUDA driver 'libvmmipc.so': its cuIpcGetMemHandle"},
        Case{"/nonexistent/libcuda.so.1",
             "cannot load the CUDA driver '/nonexistent/libcuda.so.1'"}}) {
    SCOPED_TRACE(c.library);
    auto peer = Peer("peer", "0", {{"VMMIPC_CUDA_LIBRARY", c.library}});
    const std::string not_supported = ErrPrefix(CUDA_ERROR_NOT_SUPPORTED);
    EXPECT_TRUE(StartsWith(peer->Call("alloc_vmm a " + Hex(kChunk) + " 1"), not_supported));
    EXPECT_TRUE(StartsWith(peer->Call("reserve " + Hex(kChunk)), not_supported));
    EXPECT_TRUE(StartsWith(peer->Call("get " + Hex(kZoneBase)), not_supported));
    EXPECT_TRUE(StartsWith(peer->Call("open " + zeros), not_supported));
    EXPECT_EQ(peer->Call("init"), "ok");  // alive, and the unhooked driver still works
    const std::string log = Log(*peer);
    EXPECT_NE(log.find(c.log), std::string::npos) << log;
    size_t errors = 0;
    for (size_t at = log.find("] error: "); at != std::string::npos;
         at = log.find("] error: ", at + 1))
      ++errors;
    EXPECT_EQ(errors, 1u) << log;
  }
}

// --- concurrency ------------------------------------------------------------------------------

// "seed:size:hex" of a buffer, as thread_opens takes it.
std::string Spec(int seed, uint64_t size, const std::string& hex) {
  return std::to_string(seed) + ":" + Hex(size) + ":" + hex;
}

TEST_F(Fault, ManyThreadsOpenAndCloseHandlesOfSeveralExportersAtOnce) {
  constexpr int kThreads = 8, kIterations = 100;
  std::vector<std::unique_ptr<PeerProcess>> exporters;
  std::string specs;
  int seed = 30;
  for (const char* rank : {"0", "2", "5"}) {
    exporters.push_back(Peer(std::string("exporter") + rank, rank));
    for (int chunks : {1, 3}) {
      const uint64_t base = VmmBuffer(*exporters.back(), "b" + std::to_string(seed), chunks, seed);
      specs += " " + Spec(seed, chunks * kChunk, Handle(*exporters.back(), base));
      ++seed;
    }
  }
  auto importer = Peer("importer", "1");
  const Resources before = Held(*importer);
  const std::string result = importer->Call(
      "thread_opens " + std::to_string(kThreads) + " " + std::to_string(kIterations) + specs,
      120000);
  EXPECT_EQ(result,
            "ok opens=" + std::to_string(kThreads * kIterations) + " failures=0 mismatches=0");
  Resources after = Held(*importer);
  after.reservations = before.reservations < 0 ? -1 : after.reservations - 1;  // the zone
  // And a page-table anchor in each of the three exporters' slots.
  EXPECT_EQ(after, WithAnchors(before, 3));
}

TEST_F(Fault, ExporterExportingFromManyThreadsGivesConsistentHandlesThatAllOpen) {
  constexpr int kThreads = 8;
  auto exporter = Peer("exporter", "0");
  auto importer = Peer("importer", "1");
  // Eight threads allocate and export at once: the first export starts the listener.
  const std::string exported =
      exporter->Call("thread_exports " + std::to_string(kThreads) + " 2", 60000);
  ASSERT_TRUE(StartsWith(exported, "ok ")) << exported;
  EXPECT_EQ(importer->Call("thread_opens 4 40 " + Value(exported), 60000),
            "ok opens=160 failures=0 mismatches=0");
  // Eight threads export the same four addresses twenty times: one handle per address.
  std::string addresses;
  std::vector<uint64_t> bases;
  for (int i = 0; i < 4; ++i) {
    bases.push_back(VmmBuffer(*exporter, "g" + std::to_string(i), 1, 40 + i));
    addresses += " " + Hex(bases.back() + 64 * i);
  }
  const std::string handles =
      exporter->Call("thread_gets " + std::to_string(kThreads) + " 20" + addresses, 60000);
  ASSERT_TRUE(StartsWith(handles, "ok ")) << handles;
  std::istringstream each(Value(handles));
  int i = 0;
  for (std::string hex; each >> hex; ++i) {
    EXPECT_EQ(hex, Handle(*exporter, bases[i] + 64 * i)) << "a thread saw another handle";
    const uint64_t ptr = Num(Value(importer->Call("open " + hex)));
    ASSERT_NE(ptr, 0u);
    EXPECT_EQ(importer->Call("check " + Hex(ptr) + " " + Hex(kChunk - 64 * i) + " " +
                             std::to_string(40 + i) + " " + Hex(64 * i)),
              "ok");
    EXPECT_EQ(importer->Call("close " + Hex(ptr)), "ok");
  }
  EXPECT_EQ(i, 4);
}

TEST_F(Fault, ImportsProceedWhileTheExporterExportsFromManyThreads) {
  auto exporter = Peer("exporter", "0");
  auto importer = Peer("importer", "1");
  const std::string first = exporter->Call("thread_exports 4 1", 60000);
  ASSERT_TRUE(StartsWith(first, "ok ")) << first;
  auto opens = std::async(std::launch::async, [&] {
    return importer->Call("thread_opens 4 100 " + Value(first), 120000);
  });
  const std::string second = exporter->Call("thread_exports 8 1", 60000);
  EXPECT_TRUE(StartsWith(second, "ok ")) << second;
  EXPECT_EQ(opens.get(), "ok opens=400 failures=0 mismatches=0");
  EXPECT_EQ(importer->Call("thread_opens 8 16 " + Value(second), 60000),
            "ok opens=128 failures=0 mismatches=0");
}

// --- fork ------------------------------------------------------------------------------------

TEST_F(Fault, ForkedExporterChildExportsThroughItsOwnListenerAndTheParentKeepsServing) {
  if (!Sim()) {
    GTEST_SKIP() << "a forked child cannot use the real driver";
  }
  auto exporter = Peer("exporter", "0");
  auto importer = Peer("importer", "1");
  const std::string parent_handle = Handle(*exporter, VmmBuffer(*exporter, "a", 2, 50));
  const std::string parent_ptr = Value(importer->Call("open " + parent_handle));
  ASSERT_FALSE(parent_ptr.empty());

  const std::string forked = exporter->Call("fork_export 2 51", 30000);
  ASSERT_TRUE(StartsWith(forked, "ok ")) << forked;
  std::istringstream words(Value(forked));
  std::string child_pid, child_handle;
  words >> child_pid >> child_handle;
  const ledger::Vmm2Handle child = Decode(child_handle);
  const ledger::Vmm2Handle parent = Decode(parent_handle);
  EXPECT_EQ(child.pid, Num(child_pid));
  EXPECT_NE(child.instance, parent.instance) << "a forked child must not keep its parent's id";

  const std::string child_ptr = Value(importer->Call("open " + child_handle));
  ASSERT_FALSE(child_ptr.empty());
  EXPECT_EQ(importer->Call("check " + child_ptr + " " + Hex(2 * kChunk) + " 51"), "ok");
  EXPECT_EQ(importer->Call("close " + child_ptr), "ok");
  // The child ends through exit(); its leftover copy of the parent's listener must not
  // stop the parent's.
  EXPECT_EQ(exporter->Call("reap " + child_pid, 30000), "ok exit=0");
  EXPECT_EQ(importer->Call("close " + parent_ptr), "ok");
  OpenCheckClose(*importer, parent_handle, 2 * kChunk, 50);
  EXPECT_NE(Log(*exporter).find("listening on @" + AbstractNameOf(child)), std::string::npos);
}

TEST_F(Fault, ForksWhileServingNeitherHangTheChildrenNorBreakTheParent) {
  constexpr int kForks = 20;
  auto exporter = Peer("exporter", "0");
  auto importer = Peer("importer", "1");
  std::string specs;
  for (int i = 0; i < 3; ++i) {
    const uint64_t base = VmmBuffer(*exporter, "f" + std::to_string(i), 1, 60 + i);
    specs += " " + Spec(60 + i, kChunk, Handle(*exporter, base));
  }
  auto opens = std::async(std::launch::async,
                          [&] { return importer->Call("thread_opens 4 150" + specs, 120000); });
  EXPECT_EQ(exporter->Call("fork_storm " + std::to_string(kForks), 120000),
            "ok exited=" + std::to_string(kForks));
  EXPECT_EQ(opens.get(), "ok opens=600 failures=0 mismatches=0");
  // And the importer side forks too, with its imports open.
  const std::string last = Handle(*exporter, VmmBuffer(*exporter, "g", 1, 63));
  const std::string ptr = Value(importer->Call("open " + last));
  ASSERT_FALSE(ptr.empty());
  EXPECT_EQ(importer->Call("fork_storm 5", 60000), "ok exited=5");
  EXPECT_EQ(importer->Call("check " + ptr + " " + Hex(kChunk) + " 63"), "ok");
  EXPECT_EQ(importer->Call("close " + ptr), "ok");
}

TEST_F(Fault, ForkedImporterChildOpensOnItsOwnAndTheParentsImportSurvives) {
  if (!Sim()) {
    GTEST_SKIP() << "a forked child cannot use the real driver";
  }
  auto exporter = Peer("exporter", "0");
  auto importer = Peer("importer", "1");
  const std::string handle = Handle(*exporter, VmmBuffer(*exporter, "a", 2, 70));
  const std::string ptr = Value(importer->Call("open " + handle));
  ASSERT_FALSE(ptr.empty());
  EXPECT_EQ(importer->Call("fork_open " + handle + " 70 " + Hex(2 * kChunk), 60000), "ok exit=0");
  EXPECT_EQ(importer->Call("check " + ptr + " " + Hex(2 * kChunk) + " 70"), "ok");
  EXPECT_EQ(importer->Call("close " + ptr), "ok");
  if (Sim()) {
    EXPECT_EQ(Held(*importer).mappings, 1);  // the page-table anchor of the stretch it used
  }
}

// The descriptors a program exec'd by `p` inherits (`ls` reading its own
// /proc/self/fd), without 0-2 and the one `ls` opened to read them.
std::set<std::string> InheritedAcrossExec(PeerProcess& p) {
  const std::string fds = p.Call("exec_fds");
  EXPECT_TRUE(StartsWith(fds, "ok")) << fds;
  std::set<std::string> out;
  std::istringstream each(fds.size() > 2 ? fds.substr(3) : "");
  for (std::string entry; each >> entry;) {
    if (std::atoi(entry.c_str()) <= 2) continue;
    const size_t eq = entry.find('=');
    const std::string target = eq == std::string::npos ? "" : entry.substr(eq + 1);
    if (StartsWith(target, "/proc/") && target.size() > 3 &&
        target.compare(target.size() - 3, 3, "/fd") == 0)
      continue;
    out.insert(entry);
  }
  return out;
}

TEST_F(Fault, EveryDescriptorVmmipcOpensIsCloexec) {
  auto exporter = Peer("exporter", "0");
  auto importer = Peer("importer", "1");
  // Descriptors the harness itself passed down, if any, are not vmmipc's.
  const std::string exporter_audit = exporter->Call("cloexec_audit");
  const std::string importer_audit = importer->Call("cloexec_audit");
  const std::set<std::string> exporter_exec = InheritedAcrossExec(*exporter);
  const std::set<std::string> importer_exec = InheritedAcrossExec(*importer);
  const std::string handle = Handle(*exporter, VmmBuffer(*exporter, "a", 3, 80));
  const std::string ptr = Value(importer->Call("open " + handle));
  ASSERT_FALSE(ptr.empty());
  // Listener socket, eventfd, accepted and received fds, chunk fds: all CLOEXEC.
  EXPECT_EQ(exporter->Call("cloexec_audit"), exporter_audit);
  EXPECT_EQ(importer->Call("cloexec_audit"), importer_audit);
  // What an exec'd program really inherits: nothing new.
  EXPECT_EQ(InheritedAcrossExec(*exporter), exporter_exec);
  EXPECT_EQ(InheritedAcrossExec(*importer), importer_exec);
  EXPECT_EQ(importer->Call("close " + ptr), "ok");
}

// An exit while the listener serves a request waits for the request's
// export (the exit gate, common/exit_gate.h): the driver tears itself down
// as the process exits, and the simulator's teardown, like the driver's,
// crashes the process (status 139, a line on stderr) if a call is still in
// progress then. The simulator holds the export of an untracked chunk that
// a peer's open asked for; the exporter exits meanwhile.
TEST_F(Fault, AnExitWhileTheListenerServesWaitsForTheRequestsExport) {
  if (!Sim()) GTEST_SKIP() << "needs the simulator's delayed export and its teardown";
  auto exporter = Peer("exporter", "0");
  auto importer = Peer("importer", "1");
  ASSERT_TRUE(exporter && importer);
  const uint64_t u = Num(Value(exporter->Call("alloc_vmm_untracked u " + Hex(kChunk))));
  ASSERT_NE(u, 0u);
  const std::string handle = Handle(*exporter, u);
  const int sleeping = SleepingThreads(exporter->pid());
  ASSERT_EQ(exporter->Call("inject_delay cuMemExportToShareableHandle 1 1500"), "ok");
  ASSERT_EQ(importer->Call("open_bg " + handle + " u"), "ok");
  ASSERT_TRUE(WaitUntil([&] { return SleepingThreads(exporter->pid()) > sleeping; }, 5000))
      << "the request's export did not start";
  EXPECT_EQ(exporter->Call("exit_now 0", 30000), "");  // no answer: it has exited
  exporter->Kill();                                    // only reaps it
  const std::string log = ExitLog(&exporter);
  EXPECT_EQ(log.find("simcuda: torn down at exit"), std::string::npos)
      << "the exit did not wait for the request's export:\n"
      << log;
  // The open fails cleanly or works; either way it answers, and leaves nothing.
  const std::string opened = importer->Call("open_bg_result u", 30000);
  if (opened.rfind("ok ", 0) == 0)
    EXPECT_EQ(importer->Call("close " + Value(opened)), "ok");
  else
    EXPECT_EQ(opened.rfind("err ", 0), 0u) << opened;
}

}  // namespace
}  // namespace vmmipc::testing
