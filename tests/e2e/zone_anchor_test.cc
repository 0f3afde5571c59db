// Page-table anchors (VMMIPC_ZONE_ANCHORS): the last close in a stretch of
// the import zone leaves one mapping of the importer's own memory there, so
// that the GPU keeps the stretch's page tables for the next open; an open
// whose chunks go where the anchor lies moves it, or drops it when the
// stretch has no other free spot; with the switch off nothing stays. The
// simulated driver refuses a map over a mapping, so an open that succeeds
// over an anchor's old spot shows that the anchor moved first. Mappings and
// allocations are read from the simulated driver; the counters from the
// VMMIPC_STATS exit report, on either driver.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "e2e_layout.h"
#include "logged_peer_test.h"
#include "peer_process.h"

namespace vmmipc::testing {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

class ZoneAnchorTable : public LoggedPeerTest {
 protected:
  // Slots of 8 MiB: a slot's part of its stretch is 8 MiB, four chunks, so
  // that a few small buffers cover it.
  const std::map<std::string, std::string> kSmallSlots = {
      {"VMMIPC_SLOT_SIZE", "8M"}, {"VMMIPC_ZONE_SLOTS", "16"}, {"VMMIPC_STATS", "1"}};

  void SetUp() override {
    LoggedPeerTest::SetUp();
    if (IsSkipped()) return;
    // The anchors' tests count the importer's fds to the one; follow's watch
    // connection and thread (the default) are counted in follow_test.cc.
    default_env_.emplace("VMMIPC_FOLLOW", "0");
    exporter_ = Peer("exporter", "0");
    ASSERT_NE(exporter_, nullptr);
  }

  // Opens `handle`, checks `size` bytes of `seed`, returns the pointer.
  uint64_t OpenChecked(PeerProcess& importer, const std::string& handle, uint64_t size, int seed) {
    const std::string answer = importer.Call("open " + handle);
    EXPECT_TRUE(StartsWith(answer, "ok ")) << answer;
    const uint64_t ptr = StartsWith(answer, "ok ") ? Num(Value(answer)) : 0;
    if (ptr != 0) {
      EXPECT_EQ(importer.Call("check " + Hex(ptr) + " " + Hex(size) + " " + std::to_string(seed)),
                "ok");
    }
    return ptr;
  }

  long Mappings(PeerProcess& p) { return Held(p).mappings; }

  // Opens `handle`, checks its bytes, expects it at `at`, closes it.
  void OpenAtAndClose(PeerProcess& importer, const std::string& handle, uint64_t size, int seed,
                      uint64_t at) {
    const uint64_t ptr = OpenChecked(importer, handle, size, seed);
    EXPECT_EQ(ptr, at) << "the exporter's arena placed the buffer elsewhere";
    EXPECT_EQ(importer.Call("close " + Hex(ptr)), "ok");
  }

  // Ends the importer and checks its VMMIPC_STATS anchor counters.
  void ExpectAnchorCounters(std::unique_ptr<PeerProcess>* importer, uint64_t mapped, uint64_t moved,
                            uint64_t dropped) {
    const std::string report = ExitLog(importer);
    EXPECT_EQ(StatsCounter(report, "zone_anchors_mapped"), mapped) << report;
    EXPECT_EQ(StatsCounter(report, "zone_anchors_moved"), moved);
    EXPECT_EQ(StatsCounter(report, "zone_anchors_dropped"), dropped);
  }

  std::unique_ptr<PeerProcess> exporter_;
};

TEST_F(ZoneAnchorTable, TheLastCloseLeavesOneAnchorThatLaterOpensKeep) {
  auto importer = Peer("importer", "1", {{"VMMIPC_STATS", "1"}});
  const std::string handle = Handle(*exporter_, VmmBuffer(*exporter_, "a", 2, 3));
  const Resources before = Held(*importer);
  for (int round = 0; round < 3; ++round) {
    const uint64_t ptr = OpenChecked(*importer, handle, 2 * kChunk, 3);
    ASSERT_EQ(ptr, kZoneBase);
    if (Sim()) {
      EXPECT_EQ(Mappings(*importer), round == 0 ? 2 : 3);  // the chunks (+ the anchor)
    }
    EXPECT_EQ(importer->Call("close " + Hex(ptr)), "ok");
  }
  if (Sim()) {
    Resources after = Held(*importer);
    after.reservations = before.reservations;  // the zone, made by the first open
    EXPECT_EQ(after, WithAnchors(before, 1));
  }
  ExpectAnchorCounters(&importer, 1, 0, 0);
}

TEST_F(ZoneAnchorTable, AnOpenWhereTheAnchorLiesMovesItWithinTheStretch) {
  auto importer = Peer("importer", "1", kSmallSlots);
  // a: one chunk at the slot's offset 0; its close anchors the top of the slot's 8 MiB.
  const std::string a = Handle(*exporter_, VmmBuffer(*exporter_, "a", 1, 4));
  ASSERT_NO_FATAL_FAILURE(OpenAtAndClose(*importer, a, kChunk, 4, kZoneBase));
  // b: three chunks right after a, up to the top: over the anchor, which moves to offset 0.
  const std::string b = Handle(*exporter_, VmmBuffer(*exporter_, "b", 3, 5));
  const uint64_t ptr = OpenChecked(*importer, b, 3 * kChunk, 5);
  ASSERT_EQ(ptr, kZoneBase + 2 * kMiB) << "the exporter's arena placed b elsewhere";
  if (Sim()) {
    EXPECT_EQ(Mappings(*importer), 4);
  }
  EXPECT_EQ(importer->Call("close " + Hex(ptr)), "ok");
  // a again, now where the anchor went: it moves back up.
  OpenAtAndClose(*importer, a, kChunk, 4, kZoneBase);
  if (Sim()) {
    EXPECT_EQ(Mappings(*importer), 1);
  }
  ExpectAnchorCounters(&importer, 1, 2, 0);
}

TEST_F(ZoneAnchorTable, AnOpenThatFillsTheStretchDropsTheAnchor) {
  auto importer = Peer("importer", "1", kSmallSlots);
  const std::string a = Handle(*exporter_, VmmBuffer(*exporter_, "a", 1, 6));
  ASSERT_NO_FATAL_FAILURE(OpenAtAndClose(*importer, a, kChunk, 6, kZoneBase));
  ASSERT_EQ(exporter_->Call("free_vmm a"), "ok");
  // d: the whole 8 MiB (the arena gives a's space back): no spot is left for the anchor.
  const std::string d = Handle(*exporter_, VmmBuffer(*exporter_, "d", 4, 7));
  const uint64_t ptr = OpenChecked(*importer, d, 4 * kChunk, 7);
  ASSERT_EQ(ptr, kZoneBase) << "the exporter's arena placed d elsewhere";
  if (Sim()) {
    EXPECT_EQ(Mappings(*importer), 4);
  }
  // Its close finds no spot either (its chunks are still mapped while it looks).
  EXPECT_EQ(importer->Call("close " + Hex(ptr)), "ok");
  if (Sim()) {
    EXPECT_EQ(Mappings(*importer), 0);
  }
  ExpectAnchorCounters(&importer, 1, 0, 1);
}

TEST_F(ZoneAnchorTable, SwitchedOffTheLastCloseLeavesNothing) {
  auto importer = Peer("importer", "1", {{"VMMIPC_ZONE_ANCHORS", "0"}, {"VMMIPC_STATS", "1"}});
  const std::string handle = Handle(*exporter_, VmmBuffer(*exporter_, "a", 2, 8));
  const Resources before = Held(*importer);
  for (int round = 0; round < 2; ++round) {
    const uint64_t ptr = OpenChecked(*importer, handle, 2 * kChunk, 8);
    EXPECT_EQ(importer->Call("close " + Hex(ptr)), "ok");
  }
  if (Sim()) {
    Resources after = Held(*importer);
    after.reservations = before.reservations;
    EXPECT_EQ(after, before);
  }
  ExpectAnchorCounters(&importer, 0, 0, 0);
}

// --- failures: an anchor only saves time, so none of these fails an open or a close ---

TEST_F(ZoneAnchorTable, NoMemoryForAnchorsLeavesOpensWorkingAndIsNotTriedAgain) {
  if (!Sim()) {
    GTEST_SKIP() << "fault injection needs the simulated driver";
  }
  auto importer = Peer("importer", "1", {{"VMMIPC_STATS", "1"}});
  const std::string handle = Handle(*exporter_, VmmBuffer(*exporter_, "a", 2, 9));
  // The importer's first cuMemCreate is the anchors' memory.
  ASSERT_TRUE(Inject(*importer, "cuMemCreate", 1, CUDA_ERROR_OUT_OF_MEMORY));
  for (int round = 0; round < 2; ++round) {
    OpenAtAndClose(*importer, handle, 2 * kChunk, 9, kZoneBase);
    EXPECT_EQ(Mappings(*importer), 0);
    EXPECT_EQ(Held(*importer).allocations, 0);
  }
  EXPECT_NE(Log(*importer).find("zone anchors: no memory on device 0 for them "
                                "(CUDA_ERROR_OUT_OF_MEMORY)"),
            std::string::npos);
  ExpectAnchorCounters(&importer, 0, 0, 0);
}

TEST_F(ZoneAnchorTable, AnAnchorWhoseAccessFailsIsUnmappedAndTheNextCloseTriesAgain) {
  if (!Sim()) {
    GTEST_SKIP() << "fault injection needs the simulated driver";
  }
  auto importer = Peer("importer", "1", {{"VMMIPC_STATS", "1"}});
  const std::string handle = Handle(*exporter_, VmmBuffer(*exporter_, "a", 2, 10));
  // The open's cuMemSetAccess is the first, the anchor's the second.
  ASSERT_TRUE(Inject(*importer, "cuMemSetAccess", 2, CUDA_ERROR_OUT_OF_MEMORY));
  OpenAtAndClose(*importer, handle, 2 * kChunk, 10, kZoneBase);
  EXPECT_EQ(Mappings(*importer), 0);  // the anchor's mapping went with its failed access
  OpenAtAndClose(*importer, handle, 2 * kChunk, 10, kZoneBase);
  EXPECT_EQ(Mappings(*importer), 1);
  ExpectAnchorCounters(&importer, 1, 0, 0);
}

TEST_F(ZoneAnchorTable, AnAnchorThatCannotBeUnmappedFailsTheOpenOverItAndStays) {
  if (!Sim()) {
    GTEST_SKIP() << "fault injection needs the simulated driver";
  }
  auto importer = Peer("importer", "1", kSmallSlots);
  const std::string a = Handle(*exporter_, VmmBuffer(*exporter_, "a", 1, 11));
  ASSERT_NO_FATAL_FAILURE(OpenAtAndClose(*importer, a, kChunk, 11, kZoneBase));
  const std::string b = Handle(*exporter_, VmmBuffer(*exporter_, "b", 3, 12));
  // b lies over the anchor: the anchor is mapped anew below, then its old
  // mapping is unmapped, the call that fails here.
  ASSERT_TRUE(Inject(*importer, "cuMemUnmap", 1, CUDA_ERROR_INVALID_VALUE));
  const Resources before = Held(*importer);
  EXPECT_TRUE(StartsWith(importer->Call("open " + b), ErrPrefix(CUDA_ERROR_MAP_FAILED)));
  EXPECT_NE(Log(*importer).find("of an anchor failed: CUDA_ERROR_INVALID_VALUE"),
            std::string::npos);
  EXPECT_EQ(Held(*importer), before);  // the old anchor, nothing more
  // Without the injection the same open moves the anchor and works.
  const uint64_t ptr = OpenChecked(*importer, b, 3 * kChunk, 12);
  EXPECT_EQ(ptr, kZoneBase + 2 * kMiB);
  EXPECT_EQ(importer->Call("close " + Hex(ptr)), "ok");
  EXPECT_EQ(Mappings(*importer), 1);
  ExpectAnchorCounters(&importer, 1, 1, 0);
}

}  // namespace
}  // namespace vmmipc::testing
