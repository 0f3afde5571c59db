// Who hears of a pause and a resume (issue 26, item 3): with VMMIPC_FOLLOW=1
// the exporter records, per chunk, the follower ids of the importers it was
// granted to (a random id per importer process, in every request), never
// their pids: a pid is reused after its process exits, and SO_PEERCRED says
// 0 for every peer outside the exporter's pid namespace. Keyed by pid, a
// chunk's pause and its resumed memory would go to whatever process has that
// pid now, or to every process of another namespace.
//
// The pids are staged in a pid namespace of the test's own (PidNamespace:
// unshare, with a user namespace around it where the test may not make one
// otherwise; skipped where neither works): the exporter runs in it, and sees
// importers outside as pid 0; an importer started in it can be given the
// pid of one that exited (clone3's set_tid), which the exporter then sees
// twice. The process that must hear nothing is a raw follower
// (raw_follower.h): it watches the exporter without the library, logs every
// event that reaches it and answers "done" to each, so what the exporter
// sends it is seen exactly, and no answer of its own holds anything back.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <regex>
#include <string>

#include "e2e_layout.h"
#include "logged_peer_test.h"
#include "peer_process.h"

namespace vmmipc::testing {
namespace {

// A follower id of the raw followers' (any but 0; an importer's own is
// random, so it is this one only once in 2^32).
constexpr const char* kRawFollower = "0x5eed";

class FollowHolders : public LoggedPeerTest {
 protected:
  void SetUp() override {
    LoggedPeerTest::SetUp();
    if (IsSkipped()) return;
    // The peers in the pid namespace get a /proc of its own (peer_process.cc),
    // which the real driver needs (docs/driver-behaviour.md#namespaces).
    std::string why;
    pid_namespace_ = PidNamespace::Create(&why);
    if (pid_namespace_ == nullptr) GTEST_SKIP() << "cannot make a pid namespace here: " << why;
    // The sockets in a directory of this test's (mkdtemp: 0700): an exporter
    // in a pid namespace has a small pid there, which names its socket, and
    // the abstract name would be shared with every process of that pid in
    // the network namespace (another such test running at the same time,
    // another namespace's process): its listener would refuse to start.
    std::string dir = (std::filesystem::temp_directory_path() / "vmmipc-holders-XXXXXX").string();
    ASSERT_NE(mkdtemp(dir.data()), nullptr) << std::strerror(errno);
    socket_dir_ = dir;
  }

  void TearDown() override {
    if (!socket_dir_.empty()) std::filesystem::remove_all(socket_dir_);
    LoggedPeerTest::TearDown();
  }

  // A peer with follow on, its VMMIPC_STATS exit report, and debug log lines
  // (an exporter's "served 0x... to pid N" says under which pid it saw whom).
  std::unique_ptr<PeerProcess> FollowPeer(const std::string& name, const std::string& rank,
                                          const PeerPlacement& placement = {}) {
    return Peer(name, rank,
                {{"VMMIPC_FOLLOW", "1"},
                 {"VMMIPC_STATS", "1"},
                 {"VMMIPC_LOG_LEVEL", "debug"},
                 {"VMMIPC_SOCKET_DIR", socket_dir_}},
                placement);
  }

  // A raw follower: vmmipc_peer without the library (its raw_watch, raw_events).
  std::unique_ptr<PeerProcess> RawPeer(const std::string& name,
                                       const PeerPlacement& placement = {}) {
    return Peer(name, "", {{"VMMIPC_SOCKET_DIR", socket_dir_}}, placement, /*preload=*/false);
  }

  // One chunk of the exporter opened by a (real) importer: its pointer, and
  // what the importer held before (its lazy state, and the watch connection
  // to this exporter, made by a first open and close).
  struct Opened {
    std::string ptr;
    Resources baseline;
  };
  Opened OpenChunk(PeerProcess& importer, const std::string& handle, int seed) {
    OpenCheckClose(importer, handle, kChunk, seed);
    Opened opened;
    opened.baseline = Held(importer);
    opened.ptr = Value(importer.Call("open " + handle));
    EXPECT_FALSE(opened.ptr.empty());
    return opened;
  }

  // Whether the raw follower's events so far are exactly one pause of the
  // chunk at `base` and one resume of it with one fd: its own chunk's.
  static bool PausedAndResumed(const std::string& events, uint64_t base) {
    const std::string chunk = Hex(base);
    return std::regex_match(
        events, std::regex("ok pause:" + chunk + ":[0-9]+:0 resume:" + chunk + ":[0-9]+:1"));
  }

  // The exit report of a peer (VMMIPC_STATS=1): its whole log, checked to hold one.
  std::string Report(std::unique_ptr<PeerProcess>* peer) {
    const std::string log = ExitLog(peer);
    EXPECT_NE(log.find("stats at exit:"), std::string::npos) << "no VMMIPC_STATS report";
    return log;
  }

  std::unique_ptr<PidNamespace> pid_namespace_;  // outlives the test's peers
  std::string socket_dir_;
};

// Pid reuse: the importer granted chunk A exits, and the next importer the
// exporter sees under its pid holds chunk B only. A's pause and resume must
// not reach it (keyed by pid they went to it: the pause, and, since it
// answers "done", A's resumed memory). The exporter and both importers run
// in the test's pid namespace, both importers at the same pid there.
TEST_F(FollowHolders, AnImporterAtAGoneImportersPidIsToldNothingOfTheGoneOnesChunk) {
  std::string why;
  if (!pid_namespace_->ChoosesPids(&why)) GTEST_SKIP() << "cannot stage a reused pid: " << why;
  constexpr pid_t kReused = 300;
  const std::string at_reused_pid = "to pid " + std::to_string(kReused) + ":";
  auto exporter = FollowPeer("exporter", "0", {pid_namespace_.get()});
  ASSERT_TRUE(exporter);
  const uint64_t a = VmmBuffer(*exporter, "a", 1, 1);
  const uint64_t b = VmmBuffer(*exporter, "b", 1, 2);
  const std::string ha = Handle(*exporter, a), hb = Handle(*exporter, b);

  auto gone = FollowPeer("gone", "1", {pid_namespace_.get(), kReused});
  ASSERT_TRUE(gone);
  ASSERT_EQ(gone->Call("pid"), "ok " + std::to_string(kReused));
  const std::string pa = Value(gone->Call("open " + ha));
  ASSERT_FALSE(pa.empty());
  EXPECT_EQ(gone->Call("check " + pa + " " + Hex(kChunk) + " 1"), "ok");
  ASSERT_NE(Log(*exporter).find("served " + Hex(a) + " " + at_reused_pid), std::string::npos)
      << "the exporter did not see the first importer as pid " << kReused;
  // It exits holding A (its handles go with it); its pid is free once it is reaped.
  Report(&gone);

  auto next = RawPeer("next", {pid_namespace_.get(), kReused});
  ASSERT_TRUE(next);
  ASSERT_EQ(next->Call("pid"), "ok " + std::to_string(kReused));
  const std::string watched = next->Call("raw_watch " + hb + " " + kRawFollower);
  ASSERT_TRUE(StartsWith(watched, "ok 1 " + Hex(b) + "+")) << watched;
  ASSERT_NE(Log(*exporter).find("served " + Hex(b) + " " + at_reused_pid), std::string::npos)
      << "the exporter did not see the next importer as pid " << kReused;

  // A's pause and resume: its only holder is gone. Every event of them is
  // sent before the exporter's call returns, so anything for `next` is
  // queued on its connection by then.
  ASSERT_EQ(exporter->Call("pause a"), "ok");
  ASSERT_EQ(exporter->Call("resume a"), "ok");
  EXPECT_EQ(next->Call("raw_events"), "ok")
      << "told of chunk " << Hex(a) << ", granted to the process that had its pid before";
  // Its own chunk's reach it: the connection works, so the silence above says something.
  ASSERT_EQ(exporter->Call("pause b"), "ok");
  ASSERT_EQ(exporter->Call("resume b"), "ok");
  const std::string events = next->Call("raw_events");
  EXPECT_TRUE(PausedAndResumed(events, b)) << events;

  const std::string exported = Report(&exporter);
  EXPECT_EQ(StatsCounter(exported, "follow_notices"), 2u) << "events other than B's own two";
  EXPECT_EQ(StatsCounter(exported, "follow_unanswered"), 0u);
}

// Another pid namespace: the exporter runs in one of its own, and sees every
// importer outside as pid 0. Two importers are granted a chunk each and a
// raw follower a third; each chunk's pause and resume reaches its holder
// only (keyed by pid, all three would hear of every chunk, and the raw
// follower, answering "done", would get each one's resumed memory).
TEST_F(FollowHolders, ImportersTheExporterSeesAsPidZeroAreToldOfTheirOwnChunksOnly) {
  auto exporter = FollowPeer("exporter", "0", {pid_namespace_.get()});
  auto first = FollowPeer("first", "1");
  auto second = FollowPeer("second", "2");
  auto raw = RawPeer("raw");
  ASSERT_TRUE(exporter && first && second && raw);
  const uint64_t a = VmmBuffer(*exporter, "a", 1, 1);
  const uint64_t b = VmmBuffer(*exporter, "b", 1, 2);
  const uint64_t c = VmmBuffer(*exporter, "c", 1, 3);
  const Opened oa = OpenChunk(*first, Handle(*exporter, a), 1);
  const Opened ob = OpenChunk(*second, Handle(*exporter, b), 2);
  ASSERT_FALSE(oa.ptr.empty() || ob.ptr.empty());
  const std::string watched = raw->Call("raw_watch " + Handle(*exporter, c) + " " + kRawFollower);
  ASSERT_TRUE(StartsWith(watched, "ok 1 " + Hex(c) + "+")) << watched;
  const std::string served = Log(*exporter);
  for (uint64_t chunk : {a, b, c})
    ASSERT_NE(served.find("served " + Hex(chunk) + " to pid ? (outside this pid namespace):"),
              std::string::npos)
        << "the exporter did not see the importer of " << Hex(chunk) << " as pid 0";
  const Resources held_a = Held(*first), held_b = Held(*second);

  // A: the first importer follows it to the new memory; nobody else is told.
  ASSERT_EQ(exporter->Call("pause a"), "ok");
  EXPECT_EQ(Settled(*first, oa.baseline), oa.baseline) << "the first importer kept A's old memory";
  ASSERT_EQ(exporter->Call("resume a"), "ok");
  ASSERT_EQ(exporter->Call("fill " + Hex(a) + " " + Hex(kChunk) + " 11"), "ok");
  EXPECT_EQ(first->Call("check " + oa.ptr + " " + Hex(kChunk) + " 11"), "ok");
  EXPECT_EQ(raw->Call("raw_events"), "ok") << "the raw follower was told of A";

  // B: the second importer likewise.
  ASSERT_EQ(exporter->Call("pause b"), "ok");
  EXPECT_EQ(Settled(*second, ob.baseline), ob.baseline)
      << "the second importer kept B's old memory";
  ASSERT_EQ(exporter->Call("resume b"), "ok");
  ASSERT_EQ(exporter->Call("fill " + Hex(b) + " " + Hex(kChunk) + " 12"), "ok");
  EXPECT_EQ(second->Call("check " + ob.ptr + " " + Hex(kChunk) + " 12"), "ok");
  EXPECT_EQ(raw->Call("raw_events"), "ok") << "the raw follower was told of B";

  // C: the raw follower's own, and only that.
  ASSERT_EQ(exporter->Call("pause c"), "ok");
  ASSERT_EQ(exporter->Call("resume c"), "ok");
  const std::string events = raw->Call("raw_events");
  EXPECT_TRUE(PausedAndResumed(events, c)) << events;

  // Each importer holds what it held after its open, its own chunk's new memory.
  EXPECT_EQ(Settled(*first, held_a), held_a);
  EXPECT_EQ(Settled(*second, held_b), held_b);
  EXPECT_EQ(first->Call("close " + oa.ptr), "ok");
  EXPECT_EQ(second->Call("close " + ob.ptr), "ok");
  for (auto* importer : {&first, &second}) {
    const std::string imported = Report(importer);
    EXPECT_EQ(StatsCounter(imported, "follow_pauses"), 1u);
    EXPECT_EQ(StatsCounter(imported, "follow_resumes"), 1u);
  }
  const std::string exported = Report(&exporter);
  EXPECT_EQ(StatsCounter(exported, "follow_notices"), 6u) << "not one pause and one resume each";
  EXPECT_EQ(StatsCounter(exported, "follow_unanswered"), 0u);
}

}  // namespace
}  // namespace vmmipc::testing
