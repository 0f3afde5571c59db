// Ahead (issues 37 and 43; VMMIPC_AHEAD=1 and VMMIPC_FOLLOW=1 in both): an exporter announces each
// handle it hands out to the importers that follow it and asked; an importer opens it ahead of its
// application, on a thread, where the application's own open would put it; the application's open
// then adopts it. What must hold: the address is the one a fetch gives; the bytes are shared both
// ways; one close of the application's unmaps it; a pause or free of the memory drops it before the
// exporter's unmap returns (nothing held); what only was opened ahead is not
// the application's to close; the bound per exporter holds; an open ahead
// never begins while an open of the application's is in progress; an
// application open that meets an open ahead of its handle halfway gets its
// pointer once; nothing is announced unless both sides asked; an announced
// handle is mapped ahead only into the slot its exporter's first open here
// established; the interior rule is decided at adoption as at a fresh open.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "e2e_layout.h"
#include "logged_peer_test.h"
#include "peer_process.h"

namespace vmmipc::testing {
namespace {

class MapAhead : public LoggedPeerTest {
 protected:
  std::unique_ptr<PeerProcess> AheadPeer(const std::string& name, const std::string& rank,
                                         std::map<std::string, std::string> env = {}) {
    env.emplace("VMMIPC_FOLLOW", "1");
    env.emplace("VMMIPC_AHEAD", "1");
    env.emplace("VMMIPC_STATS", "1");
    env.emplace("VMMIPC_LOG_LEVEL", "debug");
    return Peer(name, rank, env);
  }

  using Buffer = HandedOutBuffer;

  // A one-chunk allocation of the exporter filled with `seed`, and its handle
  // (whose get announces it).
  Buffer HandOut(PeerProcess& exporter, const std::string& name, int seed) {
    Buffer b{name, VmmBuffer(exporter, name, 1, seed), "", seed};
    b.handle = Handle(exporter, b.base);
    return b;
  }

  bool OpenedAhead(PeerProcess& importer, const Buffer& b, int ms = 5000) {
    return LogShows(importer, "mapped ahead " + Hex(b.base) + " of pid", ms);
  }

  // An exporter (rank 0) and an importer (rank 1) that follows it and asked
  // for its announcements: its first open (of "a0", handed out before it
  // followed) and close made the watch connection. `baseline`: what it holds then.
  struct Following {
    std::unique_ptr<PeerProcess> exporter, importer;
    Resources baseline;
  };
  Following Follow(std::map<std::string, std::string> exporter_env = {},
                   std::map<std::string, std::string> importer_env = {}) {
    Following f;
    f.exporter = AheadPeer("exporter", "0", std::move(exporter_env));
    f.importer = AheadPeer("importer", "1", std::move(importer_env));
    if (!f.exporter || !f.importer) return f;
    const Buffer a0 = HandOut(*f.exporter, "a0", 1);
    const std::string ptr = OpenChecked(*f.importer, a0);
    EXPECT_EQ(f.importer->Call("close " + ptr), "ok");
    f.baseline = Steady(*f.importer);
    return f;
  }

  // `r` with `chunks` more peer chunks mapped: a mapping each and, on the
  // simulated driver, the import's allocation and its memfd each.
  static Resources PlusChunks(Resources r, int chunks) {
    if (r.mappings >= 0) r.mappings += chunks;
    if (Sim() && r.allocations >= 0) r.allocations += chunks;
    if (Sim() && r.fds >= 0) r.fds += chunks;
    return r;
  }

  std::string Report(std::unique_ptr<PeerProcess>* peer) {
    const std::string log = ExitLog(peer);
    EXPECT_NE(log.find("stats at exit:"), std::string::npos) << "no VMMIPC_STATS report";
    return log;
  }
};

TEST_F(MapAhead, AnAnnouncedHandleIsOpenedAheadWhereAFetchPutsItAndTheOpenAdoptsIt) {
  auto [exporter, importer, baseline] = Follow();
  // Follows, without map ahead: where a fetch puts each chunk.
  auto plain = AheadPeer("plain", "1", {{"VMMIPC_AHEAD", "0"}});
  ASSERT_TRUE(exporter && importer && plain);
  const Buffer a1 = HandOut(*exporter, "a1", 11);
  ASSERT_TRUE(OpenedAhead(*importer, a1));
  EXPECT_EQ(Held(*importer), PlusChunks(baseline, 1));
  const std::string p = OpenChecked(*importer, a1);
  EXPECT_EQ(p, OpenChecked(*plain, a1)) << "opened ahead elsewhere than a fetch puts it";
  EXPECT_EQ(importer->Call("fill " + p + " " + Hex(kChunk) + " 21"), "ok");
  EXPECT_EQ(exporter->Call("check " + Hex(a1.base) + " " + Hex(kChunk) + " 21"), "ok");
  // One close of the application's: its open was the adopted one.
  EXPECT_EQ(importer->Call("close " + p), "ok");
  EXPECT_EQ(Settled(*importer, baseline), baseline) << "the adopted open left something held";
  EXPECT_TRUE(StartsWith(importer->Call("close " + p), "err ")) << "one close too many passed";

  const std::string report = Report(&importer);
  EXPECT_EQ(StatsCounter(report, "opens_ahead"), 1u);
  EXPECT_EQ(StatsCounter(report, "opens_adopted"), 1u);
  EXPECT_EQ(StatsCounter(Report(&plain), "opens_ahead"), 0u);
  EXPECT_EQ(StatsCounter(Report(&exporter), "announcements_sent"), 1u);
}

TEST_F(MapAhead, APauseOrFreeDropsWhatWasOpenedAheadBeforeTheUnmapReturns) {
  auto [exporter, importer, baseline] = Follow();
  ASSERT_TRUE(exporter && importer);
  const Buffer a1 = HandOut(*exporter, "a1", 11);
  const Buffer a2 = HandOut(*exporter, "a2", 12);
  ASSERT_TRUE(OpenedAhead(*importer, a1));
  ASSERT_TRUE(OpenedAhead(*importer, a2));
  ASSERT_EQ(Settled(*importer, PlusChunks(baseline, 2)), PlusChunks(baseline, 2));
  // The exporter's unmap returns once the importer acked: no wait here.
  ASSERT_EQ(exporter->Call("pause a1"), "ok");
  EXPECT_EQ(Held(*importer), PlusChunks(baseline, 1)) << "a1 is still mapped";
  ASSERT_EQ(exporter->Call("free_vmm a2"), "ok");
  EXPECT_EQ(Held(*importer), baseline) << "a2 is still mapped, or an fd of it held";
  // The paused memory's handle fails as without map ahead; the resumed
  // memory's new handle is announced and opened ahead again.
  EXPECT_TRUE(StartsWith(importer->Call("open " + a1.handle), "err "));
  ASSERT_EQ(exporter->Call("resume a1"), "ok");
  ASSERT_EQ(exporter->Call("fill " + Hex(a1.base) + " " + Hex(kChunk) + " 31"), "ok");
  const Buffer resumed{"a1", a1.base, Handle(*exporter, a1.base), 31};
  ASSERT_TRUE(LogShows(*importer, "mapped ahead " + Hex(a1.base), 5000,
                       Log(*importer).rfind("dropped what was mapped ahead")));
  const std::string p = OpenChecked(*importer, resumed);
  EXPECT_EQ(importer->Call("close " + p), "ok");
  EXPECT_EQ(Settled(*importer, baseline), baseline);

  const std::string report = Report(&importer);
  EXPECT_EQ(StatsCounter(report, "opens_ahead_dropped"), 2u);
  EXPECT_EQ(StatsCounter(report, "opens_adopted"), 1u);
}

TEST_F(MapAhead, WhatOnlyWasOpenedAheadIsNotTheApplicationsToClose) {
  auto [exporter, importer, baseline] = Follow();
  auto plain = AheadPeer("plain", "1", {{"VMMIPC_AHEAD", "0"}});
  ASSERT_TRUE(exporter && importer && plain);
  const Buffer a1 = HandOut(*exporter, "a1", 11);
  ASSERT_TRUE(OpenedAhead(*importer, a1));
  // Its address, as the application would get it.
  const std::string address = OpenChecked(*plain, a1);
  const Resources ahead = Held(*importer);
  EXPECT_TRUE(StartsWith(importer->Call("close " + address), "err "))
      << "a close of a pointer the application never got passed";
  EXPECT_EQ(Held(*importer), ahead) << "the refused close unmapped something";
  // It is still the application's to open, once.
  const std::string p = OpenChecked(*importer, a1);
  EXPECT_EQ(p, address);
  EXPECT_EQ(importer->Call("close " + p), "ok");
  EXPECT_EQ(Settled(*importer, baseline), baseline);
}

TEST_F(MapAhead, OpensAheadOfOneExporterStopAtTheirBound) {
  if (!Sim()) GTEST_SKIP() << "260 allocations: the simulator's";
  constexpr int kBound = 256;  // core/ahead.h kMaxAheadChunksPerExporter
  auto [exporter, importer, baseline] = Follow();
  ASSERT_TRUE(exporter && importer);
  std::vector<Buffer> a;
  for (int i = 1; i <= kBound + 4; ++i)
    a.push_back(HandOut(*exporter, "a" + std::to_string(i), i % 200 + 1));
  ASSERT_TRUE(LogShows(
      *importer, "not mapped ahead: the exporter's runs mapped ahead are at their bound", 10000));
  // 256 chunks of 2 MiB fill the first 512 MiB stretch of the slot, whose
  // anchor moves to the next stretch (where the ones past the bound go).
  // Nothing else is held: no fd of the 4 past the bound.
  const Resources bound = PlusChunks(baseline, kBound);
  const Resources held = Settled(*importer, bound);
  EXPECT_EQ(held.mappings, bound.mappings) << held;
  EXPECT_EQ(held.allocations, bound.allocations) << held;
  EXPECT_EQ(held.fds, bound.fds) << held;
  // The ones past the bound open the usual way; all of them close cleanly,
  // leaving an anchor in each of the two stretches (one more mapping of the
  // anchors' one allocation).
  for (const Buffer& b : a) {
    const std::string p = OpenChecked(*importer, b);
    if (!p.empty()) {
      EXPECT_EQ(importer->Call("close " + p), "ok");
    }
  }
  Resources rest = baseline;
  ++rest.mappings;
  EXPECT_EQ(Settled(*importer, rest), rest);
  const std::string report = Report(&importer);
  // Once the application's opens took some over (and closed them), there is
  // room again: an announcement still queued may be opened ahead in a gap
  // between them. Every one opened ahead was adopted.
  const uint64_t ahead = StatsCounter(report, "opens_ahead");
  EXPECT_GE(ahead, static_cast<uint64_t>(kBound));
  EXPECT_LE(ahead, static_cast<uint64_t>(kBound + 4));
  EXPECT_EQ(StatsCounter(report, "opens_adopted"), ahead);
}

// The gap rule: an open of the application's is in progress (a second
// exporter's handle, its import held by the simulator); an announcement
// that comes then waits, and is opened ahead only after that open ended.
TEST_F(MapAhead, AnOpenAheadNeverBeginsWhileAnOpenOfTheApplicationsIsInProgress) {
  if (!Sim()) GTEST_SKIP() << "needs the simulator's delayed import";
  auto [exporter, importer, baseline] = Follow();
  auto other = AheadPeer("other", "2", {{"VMMIPC_AHEAD", "0"}});
  ASSERT_TRUE(exporter && importer && other);
  const Buffer b = HandOut(*other, "b", 7);
  const int sleeping = SleepingThreads(importer->pid());
  ASSERT_EQ(importer->Call("inject_delay cuMemImportFromShareableHandle 1 3000"), "ok");
  ASSERT_EQ(importer->Call("open_bg " + b.handle + " b"), "ok");
  // Its open is in progress once one more thread sleeps: in the simulator's
  // delay (usleep: clock_nanosleep or nanosleep).
  ASSERT_TRUE(WaitUntil([&] { return SleepingThreads(importer->pid()) > sleeping; }, 5000));
  const Buffer a1 = HandOut(*exporter, "a1", 11);
  ASSERT_TRUE(LogShows(*importer, "wait for the application's opens in progress", 5000))
      << "the announcement did not wait for the open in progress";
  const std::string pb = Value(importer->Call("open_bg_result b"));
  ASSERT_FALSE(pb.empty());
  ASSERT_TRUE(OpenedAhead(*importer, a1));
  const std::string log = Log(*importer);
  const size_t app_open = log.find("opened " + Hex(b.base) + " of pid");
  const size_t ahead_open = log.find("ahead: mapping " + Hex(a1.base));
  ASSERT_NE(app_open, std::string::npos);
  ASSERT_NE(ahead_open, std::string::npos);
  EXPECT_LT(app_open, ahead_open) << "an open ahead began while the application's was in progress";
  EXPECT_EQ(importer->Call("close " + pb), "ok");
}

// An application open that meets an open ahead of the same handle halfway:
// the open ahead holds the run's placement lock (its import held by the
// simulator) when the application's open comes; the application gets the
// same pointer, adopted, and one close ends it.
TEST_F(MapAhead, AnApplicationOpenThatMeetsAnOpenAheadOfItsHandleAdoptsIt) {
  if (!Sim()) GTEST_SKIP() << "needs the simulator's delayed import";
  auto [exporter, importer, baseline] = Follow();
  auto plain = AheadPeer("plain", "1", {{"VMMIPC_AHEAD", "0"}});
  ASSERT_TRUE(exporter && importer && plain);
  const int sleeping = SleepingThreads(importer->pid());
  ASSERT_EQ(importer->Call("inject_delay cuMemImportFromShareableHandle 1 1500"), "ok");
  const Buffer a1 = HandOut(*exporter, "a1", 11);
  ASSERT_TRUE(LogShows(*importer, "ahead: mapping " + Hex(a1.base), 5000));
  // The open ahead holds the placement lock, in its delayed import.
  ASSERT_TRUE(WaitUntil([&] { return SleepingThreads(importer->pid()) > sleeping; }, 5000));
  const std::string p = OpenChecked(*importer, a1);
  EXPECT_EQ(p, OpenChecked(*plain, a1));
  EXPECT_EQ(importer->Call("close " + p), "ok");
  EXPECT_EQ(Settled(*importer, baseline), baseline) << "two opens of one handle left a reference";
  const std::string report = Report(&importer);
  EXPECT_EQ(StatsCounter(report, "opens_ahead"), 1u);
  EXPECT_EQ(StatsCounter(report, "opens_adopted"), 1u);
  EXPECT_EQ(StatsCounter(report, "reopens"), 0u);
}

TEST_F(MapAhead, NothingIsAnnouncedUnlessBothSidesAsked) {
  // An exporter without map ahead announces nothing to an importer that asks.
  {
    auto [exporter, importer, baseline] = Follow({{"VMMIPC_AHEAD", "0"}});
    ASSERT_TRUE(exporter && importer);
    const Buffer a1 = HandOut(*exporter, "a1", 11);
    const std::string p = OpenChecked(*importer, a1);
    EXPECT_EQ(importer->Call("close " + p), "ok");
    EXPECT_EQ(StatsCounter(Report(&exporter), "announcements_sent"), 0u);
    EXPECT_EQ(StatsCounter(Report(&importer), "announcements_received"), 0u);
  }
  // An importer that did not ask is announced nothing.
  {
    auto [exporter, importer, baseline] = Follow({}, {{"VMMIPC_AHEAD", "0"}});
    ASSERT_TRUE(exporter && importer);
    const Buffer a1 = HandOut(*exporter, "a1", 11);
    const std::string p = OpenChecked(*importer, a1);
    EXPECT_EQ(importer->Call("close " + p), "ok");
    EXPECT_EQ(StatsCounter(Report(&exporter), "announcements_sent"), 0u);
    EXPECT_EQ(StatsCounter(Report(&importer), "opens_ahead"), 0u);
  }
}

// Issue 43: one process with memory on several GPUs takes each GPU's slot
// (VMMIPC_RANK_FROM=gpu): its handles name slots 0, 1 and 2. An importer
// that opened its GPU 1 memory (slot 1) is announced the others; mapping them
// ahead into slots 0 and 2 would push the exporters that own those slots
// (ranks 0 and 2) out of them, to best-effort addresses. They are mapped
// ahead only into the slot the exporter's own first open established.
TEST_F(MapAhead, AnAnnouncedHandleIsMappedAheadOnlyIntoTheSlotItsExportersFirstOpenTook) {
  if (!Sim()) GTEST_SKIP() << "the host's GPU list is made up: the simulator's";
  namespace fs = std::filesystem;
  const fs::path gpus =
      fs::temp_directory_path() / ("vmmipc-ahead-slots-" + std::to_string(getpid()));
  for (const char* name : {"0000:10:00.0", "0000:11:00.0", "0000:12:00.0", "0000:13:00.0"})
    fs::create_directories(gpus / name);
  const std::map<std::string, std::string> host = {{"SIMCUDA_DEVICE_COUNT", "4"},
                                                   {"VMMIPC_HOST_GPUS", gpus.string()}};
  std::map<std::string, std::string> by_gpu = host;
  by_gpu.emplace("VMMIPC_RANK_FROM", "gpu");
  auto multi = AheadPeer("multi", "", by_gpu);
  auto importer = AheadPeer("importer", "5", host);
  ASSERT_TRUE(multi && importer);
  ASSERT_EQ(multi->Call("init 1"), "ok");
  const Buffer m1 = HandOut(*multi, "m1", 51);
  const std::string p1 = OpenChecked(*importer, m1);
  EXPECT_GE(Num(p1), kZoneBase + kSlotSize);
  EXPECT_LT(Num(p1), kZoneBase + 2 * kSlotSize) << "GPU 1's memory is not in slot 1";
  std::vector<Buffer> others;
  for (const int device : {0, 2}) {
    ASSERT_EQ(multi->Call("init " + std::to_string(device)), "ok");
    others.push_back(HandOut(*multi, "m" + std::to_string(device), 60 + device));
  }
  // Each announcement is handled one way or the other: mapped ahead, or not.
  for (const Buffer& b : others)
    ASSERT_TRUE(WaitUntil(
        [&] {
          const std::string log = Log(*importer);
          return log.find(Hex(b.base) + " of pid " + Value(multi->Call("pid")) +
                          " not mapped ahead") != std::string::npos ||
                 log.find("mapped ahead " + Hex(b.base)) != std::string::npos;
        },
        10000))
        << b.name;
  for (const char* slot : {"0", "2"})
    EXPECT_TRUE(LogShows(*importer,
                         std::string("it names rank slot ") + slot +
                             "; this process's first open of its memory placed it in slot 1",
                         0))
        << "slot " << slot;
  // The exporters that own slots 0 and 2 land there.
  for (const int rank : {0, 2}) {
    auto owner = AheadPeer("rank" + std::to_string(rank), std::to_string(rank), host);
    ASSERT_TRUE(owner);
    ASSERT_EQ(owner->Call("init " + std::to_string(rank)), "ok");
    const Buffer b = HandOut(*owner, "r", 70 + rank);
    const std::string p = OpenChecked(*importer, b);
    EXPECT_GE(Num(p), kZoneBase + rank * kSlotSize) << "rank " << rank << " at " << p;
    EXPECT_LT(Num(p), kZoneBase + (rank + 1) * kSlotSize) << "rank " << rank << " at " << p;
    EXPECT_EQ(importer->Call("close " + p), "ok");
  }
  // The multi-GPU exporter's own handles still open, where a fetch puts them.
  for (const Buffer& b : others)
    EXPECT_EQ(importer->Call("close " + OpenChecked(*importer, b)), "ok");
  EXPECT_EQ(importer->Call("close " + p1), "ok");
  std::error_code ignored;
  fs::remove_all(gpus, ignored);
}

// Issue 43: the interior rule is the open's, decided when the application
// opens. A handle taken 4 MiB into an 8 MiB chunk is mapped ahead before
// UCX's CUDA transport is loaded (the exact address); the application then
// loads it and opens the handle: it gets what a fresh open in that state
// gets, the chunk's start (UCX adds the offset itself), not the exact address.
TEST_F(MapAhead, AnInteriorHandleMappedAheadIsAdoptedUnderTheRuleOfTheOpen) {
  auto [exporter, importer, baseline] = Follow();
  auto plain = AheadPeer("plain", "1", {{"VMMIPC_AHEAD", "0"}});
  ASSERT_TRUE(exporter && importer && plain);
  constexpr uint64_t kBig = 4 * kChunk;
  const uint64_t base = Num(Value(exporter->Call("alloc_vmm big " + Hex(kBig) + " 1")));
  ASSERT_NE(base, 0u);
  ASSERT_EQ(exporter->Call("fill " + Hex(base) + " " + Hex(kBig) + " 81"), "ok");
  const std::string handle = Handle(*exporter, base + 2 * kChunk);
  ASSERT_TRUE(LogShows(*importer, "mapped ahead " + Hex(base + 2 * kChunk) + " of pid", 5000));
  for (auto* peer : {&importer, &plain})
    ASSERT_EQ((*peer)->Call(std::string("load_late ") + VMMIPC_UCT_CUDA_STANDIN_PATH), "ok");
  const std::string fresh = Value(plain->Call("open " + handle));
  const std::string adopted = Value(importer->Call("open " + handle));
  ASSERT_FALSE(fresh.empty() || adopted.empty());
  EXPECT_EQ(adopted, fresh) << "adopted at another address than a fresh open returns";
  EXPECT_EQ(importer->Call("check " + adopted + " " + Hex(kBig) + " 81"), "ok");
  EXPECT_EQ(importer->Call("close " + adopted), "ok");
  EXPECT_EQ(plain->Call("close " + fresh), "ok");
  Resources loaded = baseline;
  loaded.fds += 2;  // load_late's pipe, which its thread keeps
  EXPECT_EQ(Settled(*importer, loaded), loaded);
}

}  // namespace
}  // namespace vmmipc::testing
