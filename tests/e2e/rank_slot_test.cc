// Rank slots for processes without a rank variable: the slot comes from the
// GPU that holds the exported memory (its index among the host's GPUs in PCI
// order, whatever CUDA_VISIBLE_DEVICES says), VMMIPC_RANK_FROM pins the
// source, two exporters that claim one slot never share its addresses, and
// the export arena follows only a wanted slot.
//
// The simulated driver numbers its host GPUs 0000:10:00.0, 0000:11:00.0, ...
// and honours CUDA_VISIBLE_DEVICES; the host's list is a folder these tests
// make (VMMIPC_HOST_GPUS), so they run on the simulator only. On a GPU the
// same is checked by tests/python/spawn_slot_check.py (scripts/gpu-check.sh).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "e2e_layout.h"
#include "peer_process.h"

namespace vmmipc::testing {
namespace {

namespace fs = std::filesystem;

const uint64_t kArenaBase = EnvOr("VMMIPC_ARENA_BASE", 0x200000000000ull);

class RankSlot : public ::testing::Test {
 protected:
  void SetUp() override {
    if (DriverUnderTest() == DriverKind::kReal)
      GTEST_SKIP() << "simulator only: the host's GPU list here is made up";
    std::string why;
    if (!DriverAvailable(&why)) GTEST_SKIP() << why;
    dir_ = fs::temp_directory_path() /
           ("vmmipc-rank-slot-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_ / "gpus");
    // Four GPUs, listed out of order, among entries that are not GPUs.
    for (const char* name : {"0000:13:00.0", "0000:11:00.0", "0000:10:00.0", "0000:12:00.0", "bind",
                             "module", "0000:zz:00.0", "new_id"})
      fs::create_directories(dir_ / "gpus" / name);
  }
  void TearDown() override {
    std::error_code ignored;
    if (!dir_.empty()) fs::remove_all(dir_, ignored);
  }

  // A peer with no rank variable on a host of four simulated GPUs, logging
  // at info level to a file. `visible` is CUDA_VISIBLE_DEVICES ("" = unset).
  std::unique_ptr<PeerProcess> Worker(const std::string& name, const std::string& visible,
                                      std::map<std::string, std::string> env = {}, int device = 0) {
    env.emplace("VMMIPC_RANK", kUnset);
    env.emplace("LOCAL_RANK", kUnset);
    env.emplace("RANK", kUnset);
    env.emplace("SIMCUDA_DEVICE_COUNT", "4");
    env.emplace("CUDA_VISIBLE_DEVICES", visible.empty() ? kUnset : visible);
    env.emplace("VMMIPC_HOST_GPUS", (dir_ / "gpus").string());
    env.emplace("VMMIPC_LOG_LEVEL", "info");
    auto peer = PeerProcess::Start(env);
    if (peer == nullptr) {
      ADD_FAILURE() << "cannot start " << name;
      return nullptr;
    }
    const fs::path log = dir_ / (name + "-" + std::to_string(++started_) + ".log");
    logs_[peer.get()] = log;
    EXPECT_EQ(peer->Call("redirect_stderr " + log.string()), "ok");
    EXPECT_EQ(peer->Call("init " + std::to_string(device)), "ok");
    return peer;
  }

  std::string Log(const PeerProcess& peer) {
    std::ifstream in(logs_.at(&peer));
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  static size_t Count(const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  }

  // Allocates and fills `chunks` chunks, returns their handle's hex.
  static std::string Share(PeerProcess& exporter, const std::string& name, int chunks, int seed,
                           uint64_t* base_out = nullptr) {
    const uint64_t base = Num(Value(
        exporter.Call("alloc_vmm " + name + " " + Hex(kChunk) + " " + std::to_string(chunks))));
    EXPECT_NE(base, 0u);
    EXPECT_EQ(exporter.Call("fill " + Hex(base) + " " + Hex(chunks * kChunk) + " " +
                            std::to_string(seed)),
              "ok");
    if (base_out != nullptr) *base_out = base;
    return Value(exporter.Call("get " + Hex(base)));
  }
  static std::string SlotOf(PeerProcess& peer, const std::string& handle) {
    const std::string fields = peer.Call("decode " + handle);
    const size_t at = fields.find("rank_slot=");
    return at == std::string::npos ? fields
                                   : fields.substr(at + 10, fields.find(' ', at) - at - 10);
  }
  static bool InZone(uint64_t p) { return p >= kZoneBase && p < kZoneBase + kSlots * kSlotSize; }

  std::unique_ptr<PeerProcess> Importer() {
    auto importer = PeerProcess::Start({{"VMMIPC_RANK", "0"},
                                        {"LOCAL_RANK", kUnset},
                                        {"RANK", kUnset},
                                        {"SIMCUDA_DEVICE_COUNT", "4"},
                                        {"VMMIPC_LOG_LEVEL", "info"}});
    if (importer == nullptr) {
      ADD_FAILURE() << "cannot start the importer";
      return nullptr;
    }
    const fs::path log = dir_ / ("importer-" + std::to_string(++started_) + ".log");
    logs_[importer.get()] = log;
    EXPECT_EQ(importer->Call("redirect_stderr " + log.string()), "ok");
    EXPECT_EQ(importer->Call("init"), "ok");
    return importer;
  }

  fs::path dir_;
  int started_ = 0;  // names each peer's log file: a new peer may reuse a gone one's address
  std::map<const PeerProcess*, fs::path> logs_;
};

TEST_F(RankSlot, SlotIsTheHostIndexOfTheGpuWhateverTheVisibleDevicesSay) {
  struct Case {
    std::string visible;
    int device;
    int host_index;
  };
  for (const Case& c :
       {Case{"", 0, 0}, Case{"", 2, 2}, Case{"2", 0, 2}, Case{"3,1", 0, 3}, Case{"3,1", 1, 1}}) {
    SCOPED_TRACE("CUDA_VISIBLE_DEVICES='" + c.visible + "' device " + std::to_string(c.device));
    uint64_t seen[2] = {0, 0};
    for (uint64_t& pointer : seen) {  // two fresh runs
      auto exporter = Worker("exporter", c.visible, {}, c.device);
      auto importer = Importer();
      ASSERT_TRUE(exporter && importer);
      const std::string handle = Share(*exporter, "a", 2, 40 + c.host_index);
      EXPECT_EQ(SlotOf(*exporter, handle), std::to_string(c.host_index));
      pointer = Num(Value(importer->Call("open " + handle)));
      ASSERT_NE(pointer, 0u);
      EXPECT_EQ(importer->Call("check " + Hex(pointer) + " " + Hex(2 * kChunk) + " " +
                               std::to_string(40 + c.host_index)),
                "ok");
      const std::string log = Log(*exporter);
      EXPECT_EQ(Count(log, "rank slot " + std::to_string(c.host_index) + " from the GPU"), 1u)
          << log;
      EXPECT_NE(log.find("[vmmipc pid " + std::to_string(exporter->pid()) + " gpu slot " +
                         std::to_string(c.host_index) + "]"),
                std::string::npos)
          << log;
    }
    EXPECT_EQ(seen[0], seen[1]);
    // Not in the arena (a slot from the GPU under auto does not turn it on):
    // the region is the exporter's own reservation, so the offset is 0.
    EXPECT_EQ(seen[0], kZoneBase + c.host_index * kSlotSize);
  }
}

TEST_F(RankSlot, TwoExportersOnOneGpuNeverShareTheSlotAndOneWarningNamesBoth) {
  auto first = Worker("first", "1");
  auto second = Worker("second", "1");
  auto importer = Importer();
  ASSERT_TRUE(first && second && importer);
  const std::string a = Share(*first, "a", 2, 51);
  const std::string b = Share(*second, "b", 2, 52);
  const std::string c = Share(*second, "c", 1, 53);
  ASSERT_EQ(SlotOf(*first, a), "1");
  ASSERT_EQ(SlotOf(*second, b), "1");
  // Both allocations sit at offset 0 of their own reservations: without the
  // slot check the second would land on the first's addresses.
  const uint64_t pa = Num(Value(importer->Call("open " + a)));
  const uint64_t pb = Num(Value(importer->Call("open " + b)));
  const uint64_t pc = Num(Value(importer->Call("open " + c)));
  ASSERT_TRUE(pa && pb && pc);
  EXPECT_EQ(pa, kZoneBase + 1 * kSlotSize);
  EXPECT_FALSE(InZone(pb)) << Hex(pb);
  EXPECT_FALSE(InZone(pc)) << Hex(pc);
  EXPECT_EQ(importer->Call("check " + Hex(pa) + " " + Hex(2 * kChunk) + " 51"), "ok");
  EXPECT_EQ(importer->Call("check " + Hex(pb) + " " + Hex(2 * kChunk) + " 52"), "ok");
  EXPECT_EQ(importer->Call("check " + Hex(pc) + " " + Hex(kChunk) + " 53"), "ok");
  const std::string log = Log(*importer);
  const std::string warning = "rank slot 1 already serves pid " + std::to_string(first->pid()) +
                              ", and pid " + std::to_string(second->pid()) + " claims it too";
  EXPECT_EQ(Count(log, warning), 1u) << log;
  EXPECT_NE(log.find("set VMMIPC_RANK"), std::string::npos) << log;

  // Once the first exporter's last open there is closed, the slot is free.
  EXPECT_EQ(importer->Call("close " + Hex(pa)), "ok");
  const std::string d = Share(*second, "d", 1, 54);
  const uint64_t pd = Num(Value(importer->Call("open " + d)));
  ASSERT_NE(pd, 0u);
  EXPECT_TRUE(InZone(pd)) << Hex(pd);
  EXPECT_EQ(importer->Call("check " + Hex(pd) + " " + Hex(kChunk) + " 54"), "ok");
  for (uint64_t p : {pb, pc, pd}) EXPECT_EQ(importer->Call("close " + Hex(p)), "ok");
}

// Containers that each see only their own GPU (issue 25 item 5): the
// runtime's /proc/driver/nvidia/gpus lists that one GPU, so each exporter
// finds itself GPU 0 of 1, on whichever GPU of the host it runs. The second
// of them to be opened is placed best-effort with the one warning naming
// both and the fix; never silently on the first's addresses.
TEST_F(RankSlot, ContainersThatEachSeeOneGpuAllTakeSlotZeroAndTheCollisionIsNamed) {
  for (const char* gpu : {"0000:11:00.0", "0000:13:00.0"})
    fs::create_directories(dir_ / (std::string("only-") + gpu) / gpu);
  auto first = Worker("first", "1", {{"VMMIPC_HOST_GPUS", (dir_ / "only-0000:11:00.0").string()}});
  auto second =
      Worker("second", "3", {{"VMMIPC_HOST_GPUS", (dir_ / "only-0000:13:00.0").string()}});
  auto importer = Importer();
  ASSERT_TRUE(first && second && importer);
  const std::string a = Share(*first, "a", 1, 55);
  const std::string b = Share(*second, "b", 1, 56);
  EXPECT_EQ(SlotOf(*first, a), "0");
  EXPECT_EQ(SlotOf(*second, b), "0");
  EXPECT_NE(Log(*second).find("rank slot 0 from the GPU"), std::string::npos) << Log(*second);
  EXPECT_NE(Log(*second).find("GPU 0 of 1 on this host"), std::string::npos) << Log(*second);
  const uint64_t pa = Num(Value(importer->Call("open " + a)));
  const uint64_t pb = Num(Value(importer->Call("open " + b)));
  ASSERT_TRUE(pa && pb);
  EXPECT_EQ(pa, kZoneBase);
  EXPECT_FALSE(InZone(pb)) << Hex(pb);
  EXPECT_EQ(importer->Call("check " + Hex(pa) + " " + Hex(kChunk) + " 55"), "ok");
  EXPECT_EQ(importer->Call("check " + Hex(pb) + " " + Hex(kChunk) + " 56"), "ok");
  const std::string log = Log(*importer);
  EXPECT_EQ(Count(log, "rank slot 0 already serves pid " + std::to_string(first->pid()) +
                           ", and pid " + std::to_string(second->pid()) + " claims it too"),
            1u)
      << log;
  EXPECT_NE(log.find("set VMMIPC_RANK"), std::string::npos) << log;
  for (uint64_t p : {pa, pb}) EXPECT_EQ(importer->Call("close " + Hex(p)), "ok");
}

TEST_F(RankSlot, WithoutAHostListTheExporterIsUnrankedWithOneInfoLine) {
  auto exporter = Worker("exporter", "2", {{"VMMIPC_HOST_GPUS", (dir_ / "missing").string()}});
  auto importer = Importer();
  ASSERT_TRUE(exporter && importer);
  const std::string a = Share(*exporter, "a", 1, 61);
  const std::string b = Share(*exporter, "b", 1, 62);
  EXPECT_EQ(SlotOf(*exporter, a), "unranked");
  EXPECT_EQ(SlotOf(*exporter, b), "unranked");
  const uint64_t p = Num(Value(importer->Call("open " + a)));
  ASSERT_NE(p, 0u);
  EXPECT_FALSE(InZone(p));
  EXPECT_EQ(importer->Call("check " + Hex(p) + " " + Hex(kChunk) + " 61"), "ok");
  const std::string log = Log(*exporter);
  EXPECT_EQ(Count(log, "no rank slot from the GPU for device 0"), 1u) << log;
  EXPECT_NE(log.find("missing cannot be read"), std::string::npos) << log;
  EXPECT_NE(log.find(" info: "), std::string::npos) << log;  // auto: not a warning
}

TEST_F(RankSlot, AGpuMissingFromTheHostListIsUnranked) {
  fs::remove_all(dir_ / "gpus" / "0000:12:00.0");
  auto exporter = Worker("exporter", "2", {{"VMMIPC_RANK_FROM", "gpu"}});
  ASSERT_TRUE(exporter);
  const std::string a = Share(*exporter, "a", 1, 63);
  EXPECT_EQ(SlotOf(*exporter, a), "unranked");
  const std::string log = Log(*exporter);
  EXPECT_NE(log.find("0000:12:00.0 is not among the 3 GPUs"), std::string::npos) << log;
  EXPECT_NE(log.find(" warning: no rank slot from the GPU"), std::string::npos) << log;
}

TEST_F(RankSlot, RankFromPinsTheSource) {
  struct Case {
    std::map<std::string, std::string> env;
    std::string slot;
  };
  const std::vector<Case> cases = {
      {{{"LOCAL_RANK", "5"}}, "5"},                               // auto: the variable first
      {{{"LOCAL_RANK", "5"}, {"VMMIPC_RANK_FROM", "gpu"}}, "2"},  // gpu: the variable ignored
      {{{"VMMIPC_RANK", "6"}, {"VMMIPC_RANK_FROM", "gpu"}}, "2"},
      {{{"VMMIPC_RANK_FROM", "env"}}, "unranked"},  // env: no variable, no slot
      {{{"VMMIPC_RANK", "6"}, {"VMMIPC_RANK_FROM", "off"}}, "unranked"},
      {{{"VMMIPC_RANK_FROM", "sometimes"}}, "2"},  // refused: auto stays
  };
  for (const Case& c : cases) {
    std::string name;
    for (const auto& [k, v] : c.env) name += k + "=" + v + " ";
    SCOPED_TRACE(name);
    auto exporter = Worker("exporter", "2", c.env);
    ASSERT_TRUE(exporter);
    EXPECT_EQ(SlotOf(*exporter, Share(*exporter, "a", 1, 64)), c.slot);
  }
  auto refused = Worker("refused", "2", {{"VMMIPC_RANK_FROM", "sometimes"}});
  ASSERT_TRUE(refused);
  Share(*refused, "a", 1, 65);
  EXPECT_NE(Log(*refused).find("ignoring VMMIPC_RANK_FROM='sometimes': must be auto, env, gpu "
                               "or off"),
            std::string::npos)
      << Log(*refused);
}

TEST_F(RankSlot, TheArenaFollowsAWantedSlotOnly) {
  // auto, slot from the GPU: reservations stay the driver's.
  auto plain = Worker("plain", "3");
  ASSERT_TRUE(plain);
  const uint64_t driver_placed = Num(Value(plain->Call("reserve " + Hex(4 * kChunk))));
  EXPECT_NE(driver_placed, 0u);
  EXPECT_TRUE(driver_placed < kArenaBase || driver_placed >= kArenaBase + kSlotSize)
      << Hex(driver_placed);
  // VMMIPC_RANK_FROM=gpu: every process is a GPU rank, the arena is on, and
  // the importer mirrors the arena into the GPU's slot.
  auto ranked = Worker("ranked", "3", {{"VMMIPC_RANK_FROM", "gpu"}});
  auto importer = Importer();
  ASSERT_TRUE(ranked && importer);
  EXPECT_EQ(Num(Value(ranked->Call("reserve " + Hex(4 * kChunk)))), kArenaBase);
  uint64_t base = 0;
  const std::string handle = Share(*ranked, "a", 2, 66, &base);
  EXPECT_EQ(base, kArenaBase + 4 * kChunk);
  const uint64_t p = Num(Value(importer->Call("open " + handle)));
  EXPECT_EQ(p, kZoneBase + 3 * kSlotSize + 4 * kChunk);
  EXPECT_EQ(importer->Call("check " + Hex(p) + " " + Hex(2 * kChunk) + " 66"), "ok");
}

}  // namespace
}  // namespace vmmipc::testing
