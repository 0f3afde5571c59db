// End-to-end behaviour of libvmmipc.so: real processes (vmmipc_peer), real
// sockets and fd passing, real fixed-address reservations. In CI the driver is
// the simulated one (label sim); with E2E_DRIVER=gpu the same tests run
// on the real driver (label gpu) and skip without a GPU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "e2e_layout.h"
#include "handle_hex.h"
#include "ledger/handle_codec.h"
#include "peer_process.h"

namespace vmmipc::testing {
namespace {

class EndToEnd : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!DriverAvailable(&why)) GTEST_SKIP() << why;
  }

  // A started and initialised peer with the given rank ("" = unranked).
  std::unique_ptr<PeerProcess> Peer(const std::string& rank,
                                    std::map<std::string, std::string> env = {},
                                    bool preload = true) {
    env.emplace("VMMIPC_RANK", rank.empty() ? kUnset : rank);
    // Unranked means no slot at all, also on a host whose GPU would give one.
    if (rank.empty()) env.emplace("VMMIPC_RANK_FROM", "env");
    env.emplace("LOCAL_RANK", kUnset);
    env.emplace("RANK", kUnset);
    auto peer = PeerProcess::Start(env, preload);
    EXPECT_NE(peer, nullptr);
    EXPECT_EQ(peer->Call("init"), "ok");
    return peer;
  }

  // Allocates `chunks` VMM chunks in exporter `p`, fills them with `seed`,
  // returns the base.
  uint64_t VmmBuffer(PeerProcess& p, const std::string& name, int chunks, int seed) {
    uint64_t base =
        Num(Value(p.Call("alloc_vmm " + name + " " + Hex(kChunk) + " " + std::to_string(chunks))));
    EXPECT_NE(base, 0u);
    EXPECT_EQ(p.Call("fill " + Hex(base) + " " + Hex(chunks * kChunk) + " " + std::to_string(seed)),
              "ok");
    return base;
  }

  static bool SimStats(PeerProcess& p, std::string* stats) {
    *stats = p.Call("stats");
    return stats->rfind("ok ", 0) == 0;
  }
};

// --- every resolution path a real program uses --------------------------------------------

class ResolutionPath : public EndToEnd, public ::testing::WithParamInterface<const char*> {};

TEST_P(ResolutionPath, ImporterReadsAndWritesExporterMemory) {
  auto exporter = Peer("0");
  auto importer = Peer("1");
  ASSERT_EQ(exporter->Call(std::string("resolve ") + GetParam()), "ok");
  ASSERT_EQ(importer->Call(std::string("resolve ") + GetParam()), "ok");
  uint64_t base = VmmBuffer(*exporter, "a", 2, 1);
  std::string handle = Value(exporter->Call("get " + Hex(base)));
  ASSERT_EQ(handle.size(), 128u);
  EXPECT_EQ(handle.substr(0, 8), "564d4d32");  // "VMM2"
  uint64_t ptr = Num(Value(importer->Call("open " + handle)));
  ASSERT_NE(ptr, 0u);
  EXPECT_EQ(importer->Call("check " + Hex(ptr) + " " + Hex(2 * kChunk) + " 1"), "ok");
  EXPECT_EQ(importer->Call("fill " + Hex(ptr) + " " + Hex(2 * kChunk) + " 2"), "ok");
  EXPECT_EQ(exporter->Call("check " + Hex(base) + " " + Hex(2 * kChunk) + " 2"), "ok");
  EXPECT_EQ(importer->Call("close " + Hex(ptr)), "ok");
}

INSTANTIATE_TEST_SUITE_P(AllPaths, ResolutionPath,
                         ::testing::Values("direct", "dlsym", "proc4010", "proc11000", "proc12000",
                                           "self"));

// --- contract -----------------------------------------------------------------------------

TEST_F(EndToEnd, InteriorPointerMapsToTheEndOfTheRunAcrossChunks) {
  auto exporter = Peer("0");
  auto importer = Peer("1");
  uint64_t base = VmmBuffer(*exporter, "a", 4, 3);
  const uint64_t interior = base + kChunk + 4096;
  std::string handle = Value(exporter->Call("get " + Hex(interior)));
  ASSERT_FALSE(handle.empty());
  uint64_t ptr = Num(Value(importer->Call("open " + handle)));
  ASSERT_NE(ptr, 0u);
  // Everything from the interior pointer to the end of chunk 3, across boundaries.
  const uint64_t rest = 4 * kChunk - (kChunk + 4096);
  EXPECT_EQ(importer->Call("check " + Hex(ptr) + " " + Hex(rest) + " 3 " + Hex(kChunk + 4096)),
            "ok");
  // The imported range starts at the chunk holding the pointer, like an allocation.
  EXPECT_EQ(importer->Call("attr " + Hex(ptr) + " range"),
            "ok " + Hex(ptr - 4096) + " " + Hex(3 * kChunk));
  EXPECT_EQ(importer->Call("range " + Hex(ptr + kChunk)),
            "ok " + Hex(ptr - 4096) + " " + Hex(3 * kChunk));
  EXPECT_EQ(importer->Call("close " + Hex(ptr)), "ok");
}

// VMMIPC_INTERIOR_HANDLES: a handle taken inside a chunk opens at the image of
// its exact address (address), or of the start of its chunk (allocation: the
// driver's rule for legacy handles, which callers that add
// `p - cuMemGetAddressRange(p).base` themselves need); auto picks allocation
// only where UCX's CUDA transport is loaded. A handle at a chunk's start opens
// the same under every rule.
class InteriorHandles : public EndToEnd {
 protected:
  struct Opened {
    uint64_t interior = 0;  // the open of the handle taken at base + kChunk + 4096
    uint64_t at_chunk = 0;  // the open of the handle taken at base + kChunk
  };
  // Exporter: 4 chunks; the importer, under `rule` ("" = unset), opens the
  // interior handle, then the handle at the start of the same chunk.
  Opened OpenBoth(const std::string& rule, bool load_uct_standin) {
    exporter_ = Peer("0");
    importer_ = Peer("1", {{"VMMIPC_INTERIOR_HANDLES", rule.empty() ? kUnset : rule}});
    if (load_uct_standin) {
      EXPECT_EQ(importer_->Call(std::string("load_late ") + VMMIPC_UCT_CUDA_STANDIN_PATH), "ok");
    }
    base_ = VmmBuffer(*exporter_, "a", 4, 3);
    Opened opened;
    opened.interior = Num(Value(
        importer_->Call("open " + Value(exporter_->Call("get " + Hex(base_ + kChunk + 4096))))));
    opened.at_chunk =
        Num(Value(importer_->Call("open " + Value(exporter_->Call("get " + Hex(base_ + kChunk))))));
    EXPECT_NE(opened.interior, 0u);
    EXPECT_NE(opened.at_chunk, 0u);
    return opened;
  }
  // The bytes at `ptr` are the exporter's at offset `offset` of the buffer,
  // to the end of the run; both opens close cleanly.
  void ExpectReadsAndCloses(const Opened& opened, uint64_t ptr, uint64_t offset) {
    EXPECT_EQ(
        importer_->Call("check " + Hex(ptr) + " " + Hex(4 * kChunk - offset) + " 3 " + Hex(offset)),
        "ok");
    EXPECT_EQ(importer_->Call("close " + Hex(opened.interior)), "ok");
    EXPECT_EQ(importer_->Call("close " + Hex(opened.at_chunk)), "ok");
    EXPECT_EQ(importer_->Call("close " + Hex(opened.at_chunk)).substr(0, 5), "err 1");
  }
  std::unique_ptr<PeerProcess> exporter_, importer_;
  uint64_t base_ = 0;
};

TEST_F(InteriorHandles, AddressOpensAtTheExactAddress) {
  const Opened opened = OpenBoth("address", /*load_uct_standin=*/true);
  EXPECT_EQ(opened.interior, opened.at_chunk + 4096);
  ExpectReadsAndCloses(opened, opened.interior, kChunk + 4096);
}

TEST_F(InteriorHandles, AllocationOpensAtTheStartOfTheChunkAsTheDriverDoes) {
  const Opened opened = OpenBoth("allocation", /*load_uct_standin=*/false);
  // Both handles now name one open of one run, as two legacy handles of one
  // allocation do: the same pointer, each open with its close.
  EXPECT_EQ(opened.interior, opened.at_chunk);
  // What UCX does with it: the exporter's offset from cuMemGetAddressRange.
  EXPECT_EQ(exporter_->Call("range " + Hex(base_ + kChunk + 4096)),
            "ok " + Hex(base_ + kChunk) + " " + Hex(kChunk));
  ExpectReadsAndCloses(opened, opened.interior + 4096, kChunk + 4096);
}

TEST_F(InteriorHandles, AutoIsTheExactAddressWithoutUcx) {
  const Opened opened = OpenBoth("", /*load_uct_standin=*/false);
  EXPECT_EQ(opened.interior, opened.at_chunk + 4096);
  ExpectReadsAndCloses(opened, opened.interior, kChunk + 4096);
}

TEST_F(InteriorHandles, AutoIsTheChunkStartOnceUcxsCudaTransportIsLoaded) {
  const Opened opened = OpenBoth("auto", /*load_uct_standin=*/true);
  EXPECT_EQ(opened.interior, opened.at_chunk);
  ExpectReadsAndCloses(opened, opened.interior + 4096, kChunk + 4096);
}

TEST_F(InteriorHandles, AnUnknownRuleKeepsTheDefault) {
  const Opened opened = OpenBoth("base", /*load_uct_standin=*/false);
  EXPECT_EQ(opened.interior, opened.at_chunk + 4096);
  ExpectReadsAndCloses(opened, opened.interior, kChunk + 4096);
}

TEST_F(EndToEnd, LegacyMemoryGoesToTheDriverUntouched) {
  auto exporter = Peer("0");
  auto importer = Peer("1");
  uint64_t base = Num(Value(exporter->Call("alloc_legacy " + Hex(4 * kChunk))));
  ASSERT_NE(base, 0u);
  ASSERT_EQ(exporter->Call("fill " + Hex(base) + " " + Hex(4 * kChunk) + " 4"), "ok");
  std::string handle = Value(exporter->Call("get " + Hex(base)));
  ASSERT_EQ(handle.size(), 128u);
  EXPECT_NE(handle.substr(0, 8), "564d4d32");
  uint64_t ptr = Num(Value(importer->Call("open " + handle)));
  ASSERT_NE(ptr, 0u);
  EXPECT_EQ(importer->Call("check " + Hex(ptr) + " " + Hex(4 * kChunk) + " 4"), "ok");
  EXPECT_EQ(importer->Call("close " + Hex(ptr)), "ok");
  EXPECT_EQ(exporter->Call("attr " + Hex(base) + " ipc_capable"), "ok 1");
}

TEST_F(EndToEnd, OpenTwiceReturnsSamePointerAndEachOpenNeedsItsClose) {
  auto exporter = Peer("0");
  auto importer = Peer("1");
  uint64_t base = VmmBuffer(*exporter, "a", 1, 5);
  std::string handle = Value(exporter->Call("get " + Hex(base)));
  std::string first = importer->Call("open " + handle);
  ASSERT_EQ(first.rfind("ok ", 0), 0u) << first;
  EXPECT_EQ(importer->Call("open " + handle), first);
  EXPECT_EQ(importer->Call("close " + Value(first)), "ok");
  // Still mapped after the first close.
  EXPECT_EQ(importer->Call("check " + Value(first) + " " + Hex(kChunk) + " 5"), "ok");
  EXPECT_EQ(importer->Call("close " + Value(first)), "ok");
  EXPECT_EQ(importer->Call("close " + Value(first)).substr(0, 5), "err 1");
}

TEST_F(EndToEnd, OpeningInTheExportingProcessIsInvalidContext) {
  auto exporter = Peer("0");
  uint64_t base = VmmBuffer(*exporter, "a", 1, 6);
  std::string handle = Value(exporter->Call("get " + Hex(base)));
  EXPECT_EQ(exporter->Call("open " + handle).substr(0, 7), "err 201");
}

TEST_F(EndToEnd, FlagsOtherThanLazyEnablePeerAccessAreInvalidValue) {
  auto exporter = Peer("0");
  auto importer = Peer("1");
  uint64_t base = VmmBuffer(*exporter, "a", 1, 7);
  std::string handle = Value(exporter->Call("get " + Hex(base)));
  EXPECT_EQ(importer->Call("open " + handle + " 0").substr(0, 6), "err 1 ");
  EXPECT_EQ(importer->Call("open " + handle + " 3").substr(0, 6), "err 1 ");
}

TEST_F(EndToEnd, NOpensOfAnInteriorPointerThenNClosesLeaveNoChunkMapped) {
  auto exporter = Peer("0");
  auto importer = Peer("1");
  uint64_t base = VmmBuffer(*exporter, "a", 2, 8);
  std::string handle = Value(exporter->Call("get " + Hex(base + kChunk + 64)));
  std::string before;
  const bool sim = SimStats(*importer, &before);
  std::string ptr;
  for (int i = 0; i < 5; ++i) {
    std::string answer = importer->Call("open " + handle);
    ASSERT_EQ(answer.rfind("ok ", 0), 0u) << answer;
    if (i == 0) ptr = Value(answer);
    EXPECT_EQ(Value(answer), ptr);
  }
  for (int i = 0; i < 5; ++i) EXPECT_EQ(importer->Call("close " + ptr), "ok");
  EXPECT_EQ(importer->Call("close " + ptr).substr(0, 6), "err 1 ");
  if (sim) {
    std::string after;
    ASSERT_TRUE(SimStats(*importer, &after));
    // The zone reservation stays (it is made once); no chunk stays mapped,
    // only the page-table anchor of the stretch the chunks used (its one
    // mapping and allocation).
    EXPECT_NE(after.find("mappings=1 "), std::string::npos) << after;
    EXPECT_NE(after.find("allocations=1 "), std::string::npos) << after;
  }
}

TEST_F(EndToEnd, VmmMemoryIsReportedLegacyIpcCapable) {
  auto exporter = Peer("0");
  uint64_t base = VmmBuffer(*exporter, "a", 1, 9);
  EXPECT_EQ(exporter->Call("attr " + Hex(base + 100) + " ipc_capable"), "ok 1");
}

TEST_F(EndToEnd, MemoryCreatedWithoutPosixFdIsSharedThanksToCuMemCreateHook) {
  auto exporter = Peer("0");
  auto importer = Peer("1");
  uint64_t base = Num(Value(exporter->Call("alloc_vmm a " + Hex(kChunk) + " 1 0 noposix")));
  ASSERT_EQ(exporter->Call("fill " + Hex(base) + " " + Hex(kChunk) + " 10"), "ok");
  std::string handle = Value(exporter->Call("get " + Hex(base)));
  uint64_t ptr = Num(Value(importer->Call("open " + handle)));
  ASSERT_NE(ptr, 0u);
  EXPECT_EQ(importer->Call("check " + Hex(ptr) + " " + Hex(kChunk) + " 10"), "ok");
}

TEST_F(EndToEnd, WithPosixFdForcingOffSuchMemoryIsRefusedClearly) {
  auto exporter = Peer("0", {{"VMMIPC_FORCE_POSIX_FD", "0"}});
  uint64_t base = Num(Value(exporter->Call("alloc_vmm a " + Hex(kChunk) + " 1 0 noposix")));
  ASSERT_NE(base, 0u);
  EXPECT_EQ(exporter->Call("get " + Hex(base)).substr(0, 6), "err 1 ");
  EXPECT_EQ(exporter->Call("attr " + Hex(base) + " ipc_capable"), "ok 0");
}

// --- placement ----------------------------------------------------------------------------

TEST_F(EndToEnd, PeerAddressesAreIdenticalInTwoFreshRuns) {
  uint64_t seen[2] = {0, 0};
  for (int run = 0; run < 2; ++run) {
    auto exporter = Peer("2");
    auto importer = Peer("1");
    uint64_t base = VmmBuffer(*exporter, "a", 3, 11);
    // Some unrelated allocation first in the importer must not matter.
    ASSERT_NE(Num(Value(importer->Call("alloc_vmm noise " + Hex(kChunk) + " " +
                                       std::to_string(run + 1)))),
              0u);
    std::string handle = Value(exporter->Call("get " + Hex(base + kChunk)));
    seen[run] = Num(Value(importer->Call("open " + handle)));
    ASSERT_NE(seen[run], 0u);
    EXPECT_EQ(
        importer->Call("check " + Hex(seen[run]) + " " + Hex(2 * kChunk) + " 11 " + Hex(kChunk)),
        "ok");
  }
  EXPECT_EQ(seen[0], seen[1]);
  // zone + slot * stride + (X - region base): rank 2, X one chunk into its reservation.
  EXPECT_EQ(seen[0], kZoneBase + 2 * kSlotSize + kChunk);
}

TEST_F(EndToEnd, TakenZoneBaseFallsBackThenPlacesBestEffort) {
  auto exporter = Peer("0");
  uint64_t base = VmmBuffer(*exporter, "a", 1, 12);
  std::string handle = Value(exporter->Call("get " + Hex(base)));

  const std::map<std::string, std::string> env = {
      {"VMMIPC_ZONE_FALLBACK_BASE", Hex(kFallbackBase)}};
  auto fallback = Peer("1", env);
  ASSERT_EQ(fallback->Call("occupy " + Hex(kZoneBase + kSlotSize) + " " + Hex(kChunk)), "ok");
  EXPECT_EQ(fallback->Call("open " + handle), "ok " + Hex(kFallbackBase));

  auto neither = Peer("1", env);
  ASSERT_EQ(neither->Call("occupy " + Hex(kZoneBase) + " " + Hex(kChunk)), "ok");
  ASSERT_EQ(neither->Call("occupy " + Hex(kFallbackBase + 3 * kSlotSize) + " " + Hex(kChunk)),
            "ok");
  uint64_t ptr = Num(Value(neither->Call("open " + handle)));
  ASSERT_NE(ptr, 0u);
  EXPECT_TRUE(ptr < kZoneBase || ptr >= kFallbackBase + kSlots * kSlotSize) << Hex(ptr);
  EXPECT_EQ(neither->Call("check " + Hex(ptr) + " " + Hex(kChunk) + " 12"), "ok");
  EXPECT_EQ(neither->Call("close " + Hex(ptr)), "ok");
}

TEST_F(EndToEnd, UnrankedExporterIsPlacedBestEffortAndStillCorrect) {
  auto exporter = Peer("");
  auto importer = Peer("1");
  uint64_t base = VmmBuffer(*exporter, "a", 2, 13);
  std::string handle = Value(exporter->Call("get " + Hex(base)));
  EXPECT_EQ(handle.substr(12, 4), "ffff");  // rank slot: unranked
  uint64_t ptr = Num(Value(importer->Call("open " + handle)));
  ASSERT_NE(ptr, 0u);
  EXPECT_FALSE(ptr >= kZoneBase && ptr < kZoneBase + kSlots * kSlotSize);
  EXPECT_EQ(importer->Call("check " + Hex(ptr) + " " + Hex(2 * kChunk) + " 13"), "ok");
  EXPECT_EQ(importer->Call("close " + Hex(ptr)), "ok");
}

TEST_F(EndToEnd, RankFromLocalRankWhenVmmipcRankIsUnset) {
  auto exporter = Peer("", {{"LOCAL_RANK", "3"}});
  auto importer = Peer("1");
  uint64_t base = VmmBuffer(*exporter, "a", 1, 14);
  std::string handle = Value(exporter->Call("get " + Hex(base)));
  EXPECT_EQ(importer->Call("open " + handle), "ok " + Hex(kZoneBase + 3 * kSlotSize));
}

// Legacy semantics (VMMIPC_FOLLOW=0): the open import keeps the freed memory,
// and the new memory at the same exporter address goes elsewhere. With follow
// (the default) the free unmaps the import and the new memory's handle opens
// at the old pointer (follow_test.cc, ANewHandleOfTheResumedMemoryOpensAtTheOldPointer).
TEST_F(EndToEnd, RecreatedMemoryIsNeverAliasedWithAStaleImport) {
  auto exporter = Peer("0", {{"VMMIPC_FOLLOW", "0"}});
  auto importer = Peer("1", {{"VMMIPC_FOLLOW", "0"}});
  uint64_t base1 = VmmBuffer(*exporter, "a", 1, 15);
  std::string h1 = Value(exporter->Call("get " + Hex(base1)));
  uint64_t p1 = Num(Value(importer->Call("open " + h1)));
  ASSERT_NE(p1, 0u);
  ASSERT_EQ(exporter->Call("free_vmm a"), "ok");
  uint64_t base2 = VmmBuffer(*exporter, "b", 1, 16);
  std::string h2 = Value(exporter->Call("get " + Hex(base2)));
  uint64_t p2 = Num(Value(importer->Call("open " + h2)));
  ASSERT_NE(p2, 0u);
  EXPECT_NE(p1, p2);
  EXPECT_EQ(importer->Call("check " + Hex(p2) + " " + Hex(kChunk) + " 16"), "ok");
  EXPECT_EQ(importer->Call("check " + Hex(p1) + " " + Hex(kChunk) + " 15"), "ok");
  EXPECT_EQ(importer->Call("close " + Hex(p1)), "ok");
  // The first handle's memory is gone in the exporter: a fresh open is refused.
  EXPECT_EQ(importer->Call("open " + h1).substr(0, 7), "err 400");
  EXPECT_EQ(importer->Call("close " + Hex(p2)), "ok");
}

// --- bad input and faults -----------------------------------------------------------------

TEST_F(EndToEnd, DeadExporterFailsFastWithInvalidHandle) {
  auto exporter = Peer("0");
  auto importer = Peer("1", {{"VMMIPC_TIMEOUT_MS", "1000"}});
  uint64_t base = VmmBuffer(*exporter, "a", 1, 17);
  std::string handle = Value(exporter->Call("get " + Hex(base)));
  exporter->Kill();
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(importer->Call("open " + handle).substr(0, 7), "err 400");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  EXPECT_EQ(importer->Call("pid").substr(0, 3), "ok ");
}

TEST_F(EndToEnd, GarbageAndCorruptedHandlesAreRefusedWithoutHarm) {
  auto exporter = Peer("0");
  auto importer = Peer("1");
  std::mt19937_64 rng(42);
  for (int i = 0; i < 20; ++i) {
    char hex[129];
    for (int j = 0; j < 64; ++j) std::snprintf(hex + 2 * j, 3, "%02x", int(rng() & 0xFF));
    EXPECT_EQ(importer->Call(std::string("open ") + hex).substr(0, 4), "err ");
  }
  uint64_t base = VmmBuffer(*exporter, "a", 1, 18);
  std::string handle = Value(exporter->Call("get " + Hex(base)));
  for (size_t byte : {5u, 12u, 20u, 30u, 45u, 61u}) {
    std::string bad = handle;
    bad[2 * byte] = bad[2 * byte] == '0' ? '1' : '0';
    EXPECT_EQ(importer->Call("open " + bad).substr(0, 4), "err ") << "byte " << byte;
  }
  std::string fds;
  EXPECT_EQ(importer->Call("pid").substr(0, 3), "ok ");
}

TEST_F(EndToEnd, UnknownHandleVersionIsRefusedAsNotSupported) {
  auto exporter = Peer("0");
  auto importer = Peer("1");
  uint64_t base = VmmBuffer(*exporter, "a", 1, 19);
  ledger::Vmm2Handle h = Decode(Value(exporter->Call("get " + Hex(base))));
  h.version = ledger::kHandleVersion + 1;
  EXPECT_EQ(importer->Call("open " + Encode(h)).substr(0, 7), "err 801");
}

// --- export arena -------------------------------------------------------------------------

const uint64_t kArenaBase = EnvOr("VMMIPC_ARENA_BASE", 0x200000000000ull);

// A program with several reservations of different sizes and frees in
// between; returns the addresses it got and the importer's address of the last.
std::vector<uint64_t> ArenaWorkload(EndToEnd& t, PeerProcess& exporter, PeerProcess& importer) {
  std::vector<uint64_t> seen;
  seen.push_back(Num(Value(exporter.Call("alloc_vmm a " + Hex(kChunk) + " 3"))));
  seen.push_back(Num(Value(exporter.Call("reserve " + Hex(64 * kChunk)))));
  seen.push_back(Num(Value(exporter.Call("alloc_vmm b " + Hex(kChunk) + " 1"))));
  EXPECT_EQ(exporter.Call("free_vmm a"), "ok");
  seen.push_back(
      Num(Value(exporter.Call("alloc_vmm c " + Hex(kChunk) + " 2"))));  // reuses a's hole
  seen.push_back(Num(Value(exporter.Call("reserve " + Hex(8 * kChunk) + " " + Hex(16 * kChunk)))));
  EXPECT_EQ(exporter.Call("fill " + Hex(seen[3]) + " " + Hex(2 * kChunk) + " 30"), "ok");
  std::string handle = Value(exporter.Call("get " + Hex(seen[3] + kChunk)));
  seen.push_back(Num(Value(importer.Call("open " + handle))));
  EXPECT_EQ(importer.Call("check " + Hex(seen.back()) + " " + Hex(kChunk) + " 30 " + Hex(kChunk)),
            "ok");
  return seen;
}

TEST_F(EndToEnd, ArenaGivesIdenticalOwnAndPeerAddressesInTwoFreshRuns) {
  std::vector<uint64_t> runs[2];
  for (auto& run : runs) {
    auto exporter = Peer("4");
    auto importer = Peer("1");
    run = ArenaWorkload(*this, *exporter, *importer);
  }
  EXPECT_EQ(runs[0], runs[1]);
  // Carved in the program's order from the arena, holes reused first-fit.
  EXPECT_EQ(runs[0][0], kArenaBase);
  EXPECT_EQ(runs[0][1], kArenaBase + 3 * kChunk);
  EXPECT_EQ(runs[0][2], kArenaBase + 67 * kChunk);
  EXPECT_EQ(runs[0][3], kArenaBase);
  EXPECT_EQ(runs[0][4], kArenaBase + 80 * kChunk);  // 16-chunk alignment
  // The peer address mirrors the arena offset into rank 4's slot.
  EXPECT_EQ(runs[0][5], kZoneBase + 4 * kSlotSize + 1 * kChunk);
}

TEST_F(EndToEnd, CarvedReservationsAnswerRangeAttributesThemselves) {
  auto exporter = Peer("0");
  uint64_t base = VmmBuffer(*exporter, "a", 2, 31);
  ASSERT_EQ(base, kArenaBase);
  EXPECT_EQ(exporter->Call("attr " + Hex(base + kChunk + 5) + " range"),
            "ok " + Hex(base) + " " + Hex(2 * kChunk));
  // The driver's own range query still reports the one mapping.
  EXPECT_EQ(exporter->Call("range " + Hex(base + kChunk + 5)),
            "ok " + Hex(base + kChunk) + " " + Hex(kChunk));
}

TEST_F(EndToEnd, ArenaFreesAreExactAndForeignFreesReachTheDriver) {
  auto exporter = Peer("0");
  uint64_t carve = Num(Value(exporter->Call("reserve " + Hex(4 * kChunk))));
  ASSERT_EQ(carve, kArenaBase);
  EXPECT_EQ(exporter->Call("address_free " + Hex(carve) + " " + Hex(2 * kChunk)).substr(0, 6),
            "err 1 ");
  EXPECT_EQ(exporter->Call("address_free " + Hex(carve + kChunk) + " " + Hex(kChunk)).substr(0, 6),
            "err 1 ");
  EXPECT_EQ(exporter->Call("address_free " + Hex(carve) + " " + Hex(4 * kChunk)), "ok");
  // Not the arena's: the driver answers (nothing is reserved there).
  EXPECT_EQ(exporter->Call("address_free 0x7e0000000000 " + Hex(kChunk)).substr(0, 4), "err ");
  // Reservations that ask for an address are the driver's.
  EXPECT_EQ(Num(Value(exporter->Call("reserve " + Hex(4 * kChunk)))), kArenaBase);
}

TEST_F(EndToEnd, FullArenaFallsBackToTheDriverAndStillShares) {
  // 64 MiB: smaller reservations ignore address hints (measured), so no smaller arena.
  auto exporter = Peer("0", {{"VMMIPC_ARENA_SIZE", "64M"}});
  auto importer = Peer("1");
  uint64_t in_arena = Num(Value(exporter->Call("reserve " + Hex(31 * kChunk))));
  EXPECT_EQ(in_arena, kArenaBase);
  uint64_t outside = VmmBuffer(*exporter, "b", 2, 33);
  EXPECT_TRUE(outside < kArenaBase || outside >= kArenaBase + (64ull << 20)) << Hex(outside);
  std::string handle = Value(exporter->Call("get " + Hex(outside)));
  uint64_t ptr = Num(Value(importer->Call("open " + handle)));
  ASSERT_NE(ptr, 0u);
  EXPECT_EQ(importer->Call("check " + Hex(ptr) + " " + Hex(2 * kChunk) + " 33"), "ok");
}

TEST_F(EndToEnd, ArenaIsOffWhenDisabledUnrankedOrLargerThanASlot) {
  // 8 GiB slots: neither the arena of this layout nor the default one fits a
  // slot, so the configuration turns it off (a too large VMMIPC_ARENA_SIZE
  // alone would fall back to the default size).
  for (auto env : std::vector<std::map<std::string, std::string>>{{{"VMMIPC_ARENA", "0"}},
                                                                  {{"VMMIPC_SLOT_SIZE", "8G"}}}) {
    auto exporter = Peer("0", env);
    uint64_t base = Num(Value(exporter->Call("reserve " + Hex(2 * kChunk))));
    EXPECT_NE(base, 0u);
    EXPECT_TRUE(base < kArenaBase || base >= kArenaBase + kSlotSize) << Hex(base);
  }
  auto unranked = Peer("");
  uint64_t base = Num(Value(unranked->Call("reserve " + Hex(2 * kChunk))));
  EXPECT_TRUE(base < kArenaBase || base >= kArenaBase + kSlotSize) << Hex(base);
}

// --- interposition ------------------------------------------------------------------------

TEST_F(EndToEnd, DlsymRtldNextKeepsTheCallersSemantics) {
  auto peer = Peer("0");
  EXPECT_EQ(peer->Call("rtld_next"), "ok");
}

TEST_F(EndToEnd, DisabledLibraryIsAPurePassThrough) {
  auto exporter = Peer("0", {{"VMMIPC_ENABLE", "0"}});
  uint64_t base = VmmBuffer(*exporter, "a", 1, 20);
  EXPECT_EQ(exporter->Call("get " + Hex(base)).substr(0, 6), "err 1 ");
  EXPECT_EQ(exporter->Call("attr " + Hex(base) + " ipc_capable"), "ok 0");
}

TEST_F(EndToEnd, WithoutThePreloadVmmMemoryCannotBeSharedAsMeasured) {
  auto exporter = Peer("0", {}, /*preload=*/false);
  uint64_t base = VmmBuffer(*exporter, "a", 1, 21);
  EXPECT_EQ(exporter->Call("get " + Hex(base)).substr(0, 6), "err 1 ");
}

}  // namespace
}  // namespace vmmipc::testing
