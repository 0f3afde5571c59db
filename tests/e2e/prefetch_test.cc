// Prefetch (issue 37, item 3): with VMMIPC_PREFETCH=1 and VMMIPC_FOLLOW=1 in
// both, an importer's fetch from an exporter it already follows also brings
// the fds of the other allocations the exporter handed out handles for, and
// a later open of one of their handles takes them instead of a round trip.
// What must hold: an open lands where a fetch would have put it; a chunk the
// exporter frees or pauses is dropped (the importer holds nothing of it, and
// a new handle at its address opens the new memory); the exporter's bound
// per reply holds (the rest is fetched when opened); nothing is sent that
// was not asked for; a stopped importer costs a pause the timeout, as with
// follow alone, and drops what it missed once it runs; a forked child keeps
// none of its parent's prefetched fds.
//
// The exporter's handles are made with a get each; each chunk's fd is made
// (and cached) by a raw fetch of a process without the library (follower 0:
// a holder nobody follows), so that what a reply can prefetch does not
// depend on when the export-ahead worker ran. The importer's fds are counted
// at rest: each prefetched chunk is one fd (a memfd on the simulated driver).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "e2e_layout.h"
#include "logged_peer_test.h"
#include "peer_process.h"

namespace vmmipc::testing {
namespace {

class Prefetch : public LoggedPeerTest {
 protected:
  // A peer with follow and prefetch on (unless `env` says otherwise) and the
  // VMMIPC_STATS exit report.
  std::unique_ptr<PeerProcess> PrefetchPeer(const std::string& name, const std::string& rank,
                                            std::map<std::string, std::string> env = {}) {
    env.emplace("VMMIPC_FOLLOW", "1");
    env.emplace("VMMIPC_PREFETCH", "1");
    env.emplace("VMMIPC_STATS", "1");
    return Peer(name, rank, env);
  }

  using Buffer = HandedOutBuffer;

  // `count` one-chunk allocations "a0", "a1", ... of the exporter, each
  // filled with its seed (i + 1), a handle got for each, and each chunk's
  // fd cached by a raw fetch (follower 0) from `raw`.
  std::vector<Buffer> HandedOut(PeerProcess& exporter, PeerProcess& raw, int count) {
    std::vector<Buffer> buffers;
    for (int i = 0; i < count; ++i) {
      Buffer b;
      b.name = "a" + std::to_string(i);
      b.seed = i + 1;
      b.base = VmmBuffer(exporter, b.name, 1, b.seed);
      b.handle = Handle(exporter, b.base);
      EXPECT_EQ(raw.Call("raw_fetch " + b.handle + " 0"), "ok 1") << b.name;
      buffers.push_back(b);
    }
    return buffers;
  }

  // The importer's first open of the exporter (it asks for the watch
  // connection, and so prefetches nothing) and close: what it holds then,
  // its lazy state and that connection made, is the baseline returned.
  Resources Follow(PeerProcess& importer, const Buffer& first) {
    const std::string ptr = OpenChecked(importer, first);
    EXPECT_EQ(importer.Call("close " + ptr), "ok");
    return Held(importer);
  }

  // An open and close of `b` (a fetch that prefetches what it may).
  void OpenClose(PeerProcess& importer, const Buffer& b) {
    const std::string ptr = OpenChecked(importer, b);
    if (!ptr.empty()) {
      EXPECT_EQ(importer.Call("close " + ptr), "ok");
    }
  }

  static Resources PlusFds(Resources r, int fds) {
    r.fds += fds;
    return r;
  }

  std::unique_ptr<PeerProcess> RawPeer(const std::string& name) {
    return Peer(name, "", {}, {}, /*preload=*/false);
  }

  // An exporter (rank 0) with `count` handed-out one-chunk allocations, a
  // raw peer that cached their fds, and an importer (rank 1) that follows
  // the exporter (`baseline`: what it holds after its first open and close,
  // of a0) and whose open of a1 prefetched the others, up to the bound:
  // checked, its fds at rest. Bind it: auto& [exporter, importer, raw, a, baseline].
  struct Prefetched {
    std::unique_ptr<PeerProcess> exporter, importer, raw;
    std::vector<Buffer> a;
    Resources baseline;
  };
  static constexpr int kBound = 64;  // core/prefetch.h kMaxPrefetchChunksPerReply
  Prefetched PrefetchAfterTwoOpens(int count, std::map<std::string, std::string> exporter_env = {},
                                   std::map<std::string, std::string> importer_env = {}) {
    Prefetched p;
    // VMMIPC_PREFETCH=2: each prefetched chunk is also imported ahead, on the
    // simulated driver an allocation and an fd of the driver's own.
    const bool ahead =
        importer_env.count("VMMIPC_PREFETCH") != 0 && importer_env.at("VMMIPC_PREFETCH") == "2";
    p.exporter = PrefetchPeer("exporter", "0", std::move(exporter_env));
    p.importer = PrefetchPeer("importer", "1", std::move(importer_env));
    p.raw = RawPeer("raw");
    if (!p.exporter || !p.importer || !p.raw) return p;
    p.a = HandedOut(*p.exporter, *p.raw, count);
    p.baseline = Follow(*p.importer, p.a[0]);
    // a1's fetch brings the others (a0 the importer holds already: not again).
    OpenClose(*p.importer, p.a[1]);
    const int prefetched = std::min(count - 2, kBound);
    Resources expected = PlusFds(p.baseline, ahead ? 2 * prefetched : prefetched);
    if (ahead) expected.allocations += prefetched;
    EXPECT_EQ(Settled(*p.importer, expected), expected)
        << "the importer does not hold exactly the prefetched chunks' fds (and imports)";
    return p;
  }

  // The exit report of a peer (VMMIPC_STATS=1).
  std::string Report(std::unique_ptr<PeerProcess>* peer) {
    const std::string log = ExitLog(peer);
    EXPECT_NE(log.find("stats at exit:"), std::string::npos) << "no VMMIPC_STATS report";
    return log;
  }
};

TEST_F(Prefetch, OpensOfPrefetchedHandlesNeedNoFetchAndLandWhereAFetchWouldPutThem) {
  auto [exporter, importer, raw, a, baseline] = PrefetchAfterTwoOpens(4);
  // Follows, but does not prefetch: where a fetch puts each chunk.
  auto plain = PrefetchPeer("plain", "1", {{"VMMIPC_PREFETCH", "0"}});
  ASSERT_TRUE(exporter && importer && plain && raw);
  const std::string p2 = OpenChecked(*importer, a[2]);
  const std::string p3 = OpenChecked(*importer, a[3]);
  const std::string q2 = OpenChecked(*plain, a[2]);
  const std::string q3 = OpenChecked(*plain, a[3]);
  EXPECT_EQ(p2, q2) << "a prefetched chunk opened elsewhere than a fetched one";
  EXPECT_EQ(p3, q3) << "a prefetched chunk opened elsewhere than a fetched one";
  // Shared both ways, as any open.
  EXPECT_EQ(importer->Call("fill " + p2 + " " + Hex(kChunk) + " 21"), "ok");
  EXPECT_EQ(exporter->Call("check " + Hex(a[2].base) + " " + Hex(kChunk) + " 21"), "ok");
  EXPECT_EQ(importer->Call("close " + p2), "ok");
  EXPECT_EQ(importer->Call("close " + p3), "ok");
  EXPECT_EQ(Settled(*importer, baseline), baseline) << "the opens left something held";

  const std::string imported = Report(&importer);
  EXPECT_EQ(StatsCounter(imported, "chunks_prefetched"), 2u);
  EXPECT_EQ(StatsCounter(imported, "opens_prefetched"), 2u);
  EXPECT_EQ(StatsCounter(Report(&plain), "opens_prefetched"), 0u);
  EXPECT_EQ(StatsCounter(Report(&exporter), "chunks_prefetched_out"), 2u);
}

TEST_F(Prefetch, APauseOrFreeDropsThePrefetchedChunkAndANewHandleThereIsNotStale) {
  auto [exporter, importer, raw, a, baseline] = PrefetchAfterTwoOpens(4);
  auto plain = PrefetchPeer("plain", "1", {{"VMMIPC_PREFETCH", "0"}});
  ASSERT_TRUE(exporter && importer && plain && raw);

  // A pause: the importer drops its fd of a2 before the exporter's unmap returns.
  ASSERT_EQ(exporter->Call("pause a2"), "ok");
  EXPECT_EQ(Held(*importer), PlusFds(baseline, 1)) << "the paused chunk's fd is still held";
  // The old handle fails as it does without prefetch (its memory is gone).
  EXPECT_TRUE(StartsWith(importer->Call("open " + a[2].handle), "err "));
  // A resume is new memory at the same address: a new handle opens it, at
  // the address a fetch gives it, with the new bytes.
  ASSERT_EQ(exporter->Call("resume a2"), "ok");
  ASSERT_EQ(exporter->Call("fill " + Hex(a[2].base) + " " + Hex(kChunk) + " 31"), "ok");
  Buffer resumed = a[2];
  resumed.handle = Handle(*exporter, a[2].base);
  resumed.seed = 31;
  const std::string p = OpenChecked(*importer, resumed);
  EXPECT_EQ(p, OpenChecked(*plain, resumed));
  EXPECT_EQ(importer->Call("close " + p), "ok");

  // A free: the same, and nothing of it stays.
  ASSERT_EQ(exporter->Call("free_vmm a3"), "ok");
  EXPECT_EQ(Settled(*importer, baseline), baseline) << "the freed chunk's fd is still held";
  EXPECT_TRUE(StartsWith(importer->Call("open " + a[3].handle), "err "));
  EXPECT_EQ(Settled(*importer, baseline), baseline);

  const std::string imported = Report(&importer);
  EXPECT_EQ(StatsCounter(imported, "prefetched_dropped"), 2u);
  EXPECT_EQ(StatsCounter(imported, "opens_prefetched"), 0u);
}

TEST_F(Prefetch, AReplyPrefetchesAtMostItsBoundAndTheRestIsFetchedOnOpen) {
  constexpr int kCount = 2 + kBound + 6;
  auto [exporter, importer, raw, a, baseline] = PrefetchAfterTwoOpens(kCount);
  ASSERT_TRUE(exporter && importer && raw);
  // Every handle opens: the first 64 from what was prefetched, the next by a
  // fetch (which prefetches the last 5), the last 5 prefetched again.
  for (int i = 2; i < kCount; ++i) OpenClose(*importer, a[i]);
  EXPECT_EQ(Settled(*importer, baseline), baseline);

  const std::string imported = Report(&importer);
  EXPECT_EQ(StatsCounter(imported, "opens_prefetched"), static_cast<uint64_t>(kCount - 3));
  EXPECT_EQ(StatsCounter(Report(&exporter), "chunks_prefetched_out"),
            static_cast<uint64_t>(kCount - 3));
}

TEST_F(Prefetch, NothingIsSentThatWasNotAskedFor) {
  auto exporter = PrefetchPeer("exporter", "0");
  auto off = PrefetchPeer("off", "2", {{"VMMIPC_PREFETCH", "0"}});
  auto raw = RawPeer("raw");
  ASSERT_TRUE(exporter && off && raw);
  const std::vector<Buffer> a = HandedOut(*exporter, *raw, 3);
  const std::vector<Buffer> b = HandedOut(*off, *raw, 3);
  const int fds = static_cast<int>(Num(Value(raw->Call("fds"))));
  // Without the flag: the handle's chunk, nothing else.
  EXPECT_EQ(raw->Call("raw_fetch " + a[0].handle + " 77"), "ok 1");
  // With it: the two other chunks handed out.
  EXPECT_EQ(raw->Call("raw_fetch " + a[0].handle + " 78 prefetch"), "ok 1 2");
  // Not again to the same follower: it holds them.
  EXPECT_EQ(raw->Call("raw_fetch " + a[1].handle + " 78 prefetch"), "ok 1 0");
  // An exporter with prefetch off sends nothing more, flag or not.
  EXPECT_EQ(raw->Call("raw_fetch " + b[0].handle + " 79 prefetch"), "ok 1 0");
  EXPECT_EQ(Num(Value(raw->Call("fds"))), static_cast<uint64_t>(fds + 1 + 3 + 1 + 1));
  EXPECT_EQ(StatsCounter(Report(&off), "chunks_prefetched_out"), 0u);
  EXPECT_EQ(StatsCounter(Report(&exporter), "chunks_prefetched_out"), 2u);
}

TEST_F(Prefetch, AStoppedImporterCostsAPauseTheTimeoutAndDropsWhatItMissedOnceItRuns) {
  auto [exporter, importer, raw, a, baseline] =
      PrefetchAfterTwoOpens(3, {{"VMMIPC_TIMEOUT_MS", "1000"}});
  ASSERT_TRUE(exporter && importer && raw);

  ASSERT_TRUE(StopAndWait(importer->pid()));
  const auto start = Clock::now();
  const std::string answer = exporter->Call("pause a2");
  const long pause_ms = MsSince(start);
  ASSERT_EQ(kill(importer->pid(), SIGCONT), 0);
  EXPECT_EQ(answer, "ok");
  EXPECT_LT(pause_ms, 5000) << "a stopped importer held up the pause past its bound";
  // Running again, it catches up: the prefetched fd goes.
  EXPECT_EQ(Settled(*importer, baseline), baseline) << "the importer kept the paused chunk's fd";
  EXPECT_TRUE(StartsWith(importer->Call("open " + a[2].handle), "err "));
}

// The race of an open that took a prefetched run and a pause of it: the open
// is in flight (it took the fds) and waits for its slot's placement lock,
// held by another open whose import the simulator delays; the pause comes
// then. Whichever of the open and the follow thread gets the lock first, the
// open never maps (or keeps) the memory the pause released, and the resume
// maps the new memory at its pointer.
TEST_F(Prefetch, AnOpenOfAPrefetchedRunInFlightDuringAPauseFollowsItAndTheResume) {
  if (!Sim()) GTEST_SKIP() << "needs the simulator's delayed import";
  auto [exporter, importer, raw, a, baseline] =
      PrefetchAfterTwoOpens(4, {}, {{"VMMIPC_LOG_LEVEL", "debug"}});
  ASSERT_TRUE(exporter && importer && raw);
  auto taken = [&](const Buffer& b) {
    return LogShows(*importer, "prefetch: " + Hex(b.base) + " of pid", 5000);
  };
  ASSERT_EQ(importer->Call("inject_delay cuMemImportFromShareableHandle 1 1500"), "ok");
  ASSERT_EQ(importer->Call("open_bg " + a[3].handle + " a3"), "ok");  // holds the slot's lock
  ASSERT_TRUE(taken(a[3]));
  ASSERT_EQ(importer->Call("open_bg " + a[2].handle + " a2"), "ok");  // took its fds, waits
  ASSERT_TRUE(taken(a[2]));
  EXPECT_EQ(exporter->Call("pause a2"), "ok");
  const std::string p2 = Value(importer->Call("open_bg_result a2"));
  const std::string p3 = Value(importer->Call("open_bg_result a3"));
  ASSERT_FALSE(p2.empty());
  ASSERT_FALSE(p3.empty());
  EXPECT_TRUE(StartsWith(importer->Call("check " + p2 + " 0x1000 1"), "err "))
      << "the open kept the memory the pause released";
  EXPECT_EQ(exporter->Call("resume a2"), "ok");
  EXPECT_EQ(exporter->Call("fill " + Hex(a[2].base) + " " + Hex(kChunk) + " 9"), "ok");
  EXPECT_EQ(importer->Call("check " + p2 + " " + Hex(kChunk) + " 9"), "ok");
  EXPECT_EQ(importer->Call("check " + p3 + " " + Hex(kChunk) + " 4"), "ok");
  EXPECT_EQ(importer->Call("close " + p2), "ok");
  EXPECT_EQ(importer->Call("close " + p3), "ok");
  EXPECT_EQ(Settled(*importer, baseline), baseline);
}

// VMMIPC_PREFETCH=2: the importer's thread imports what was prefetched before
// any open asks (on the simulated driver each import is an allocation and an
// fd of the driver's own); the open then only maps it, at the address a fetch
// gives it; a pause releases the import with the fd, before the exporter's
// unmap returns.
TEST_F(Prefetch, ImportedAheadAnOpenOnlyMapsAndAPauseReleasesTheImport) {
  if (!Sim()) GTEST_SKIP() << "counts the simulated driver's allocations";
  auto [exporter, importer, raw, a, baseline] =
      PrefetchAfterTwoOpens(4, {}, {{"VMMIPC_PREFETCH", "2"}});
  auto plain = PrefetchPeer("plain", "1", {{"VMMIPC_PREFETCH", "0"}});
  ASSERT_TRUE(exporter && importer && raw && plain);
  // PrefetchAfterTwoOpens saw a2 and a3 imported ahead.
  const std::string p2 = OpenChecked(*importer, a[2]);
  EXPECT_EQ(p2, OpenChecked(*plain, a[2])) << "imported ahead, it opened elsewhere";
  const Resources opened = Held(*importer);
  ASSERT_EQ(exporter->Call("pause a3"), "ok");
  Resources paused = opened;
  paused.fds -= 2;
  paused.allocations -= 1;
  EXPECT_EQ(Held(*importer), paused) << "the pause left the import or the fd of a3 held";
  EXPECT_EQ(importer->Call("close " + p2), "ok");
  EXPECT_EQ(Settled(*importer, baseline), baseline);

  const std::string report = Report(&importer);
  EXPECT_EQ(StatsCounter(report, "chunks_imported_ahead"), 1u);
  EXPECT_EQ(StatsCounter(report, "opens_prefetched"), 1u);
  EXPECT_EQ(StatsCounter(report, "prefetched_dropped"), 1u);
}

TEST_F(Prefetch, AForkedChildKeepsNoneOfItsParentsPrefetchedFds) {
  if (!Sim()) {
    GTEST_SKIP() << "a forked child cannot use the real driver";
  }
  auto [exporter, importer, raw, a, baseline] = PrefetchAfterTwoOpens(4);
  ASSERT_TRUE(exporter && importer && raw);

  std::istringstream counts(Value(importer->Call("fork_memfds", 30000)));
  int parent = -1, child = -1;
  counts >> parent >> child;
  EXPECT_EQ(child, parent - 2) << "the child kept its parent's prefetched fds";
  // The child opens a prefetched handle itself (its own fetch)...
  EXPECT_EQ(importer->Call("fork_open " + a[2].handle + " 3 " + Hex(kChunk), 60000), "ok exit=0");
  // ...and the parent still has them.
  OpenClose(*importer, a[2]);
  OpenClose(*importer, a[3]);
  EXPECT_EQ(Settled(*importer, baseline), baseline);
  EXPECT_EQ(StatsCounter(Report(&importer), "opens_prefetched"), 2u);
}

}  // namespace
}  // namespace vmmipc::testing
