// Where each settled value came from (Params::outcomes, which vmmipc-config
// reports), the layout parts turned off for want of room as opposed to by
// choice, the values as text, and the slot a GPU's host index gives.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "config/params.h"
#include "params_test_support.h"

namespace vmmipc::config {
namespace {

const Outcome& OutcomeOf(const Params& p, const char* name) {
  const size_t index = ParamIndex(name);
  EXPECT_LT(index, kParamCount) << name;
  return p.outcomes.at(index);
}

TEST(ParamsOutcome, EveryVariableHasOneAndIndexFindsIt) {
  EXPECT_EQ(AllParams().size(), kParamCount);
  for (size_t i = 0; i < kParamCount; ++i) EXPECT_EQ(ParamIndex(AllParams()[i].name), i);
  EXPECT_EQ(ParamIndex("VMMIPC_LOGLEVEL"), kParamCount);
  const Params p = ParseWith({});
  for (const Outcome& outcome : p.outcomes) {
    EXPECT_EQ(outcome.origin, Origin::kDefault);
    EXPECT_EQ(outcome.why, "");
  }
}

TEST(ParamsOutcome, SetRefusedAndSettledValuesSaySo) {
  const Params p = ParseWith(
      {{"VMMIPC_STATS", "1"}, {"VMMIPC_TIMEOUT_MS", "0"}, {"VMMIPC_ARENA_BASE", "0x300000000000"}});
  EXPECT_EQ(OutcomeOf(p, "VMMIPC_STATS").origin, Origin::kEnvironment);
  EXPECT_EQ(OutcomeOf(p, "VMMIPC_TIMEOUT_MS").origin, Origin::kIgnored);
  EXPECT_EQ(OutcomeOf(p, "VMMIPC_TIMEOUT_MS").why,
            "ignoring VMMIPC_TIMEOUT_MS='0': must be between 1 and 3600000; using the default "
            "5000");
  // The arena moved back to its defaults: both its variables, one warning.
  for (const char* name : {"VMMIPC_ARENA_BASE", "VMMIPC_ARENA_SIZE"}) {
    EXPECT_EQ(OutcomeOf(p, name).origin, Origin::kLayout) << name;
    EXPECT_EQ(OutcomeOf(p, name).why, p.warnings.back()) << name;
  }
  EXPECT_EQ(OutcomeOf(p, "VMMIPC_ARENA").origin, Origin::kDefault);
  EXPECT_FALSE(p.turned_off.arena);
  EXPECT_EQ(p.warnings.size(), 2u);
}

TEST(ParamsOutcome, PartsTurnedOffForWantOfRoomAreTold) {
  const Params p =
      ParseWith({{"VMMIPC_ZONE_SLOTS", "100"}, {"VMMIPC_ZONE_BASE", "0x100000000000"}});
  EXPECT_FALSE(p.turned_off.zone);
  EXPECT_TRUE(p.turned_off.fallback);
  EXPECT_TRUE(p.turned_off.arena);
  EXPECT_EQ(OutcomeOf(p, "VMMIPC_ZONE_FALLBACK_BASE").origin, Origin::kLayout);
  EXPECT_EQ(OutcomeOf(p, "VMMIPC_ARENA").origin, Origin::kLayout);
  // At their defaults already: only what turned them off changed.
  EXPECT_EQ(OutcomeOf(p, "VMMIPC_ARENA_BASE").origin, Origin::kDefault);
  // Off by choice is not for want of room.
  const Params chosen = ParseWith({{"VMMIPC_ZONE_FALLBACK_BASE", "0"}, {"VMMIPC_ARENA", "0"}});
  EXPECT_FALSE(chosen.turned_off.fallback);
  EXPECT_FALSE(chosen.turned_off.arena);
  EXPECT_EQ(OutcomeOf(chosen, "VMMIPC_ARENA").origin, Origin::kEnvironment);
}

TEST(ParamsOutcome, TheRankRuleIsTold) {
  Params p = ParseWith({{"LOCAL_RANK", "2"}});
  EXPECT_EQ(OutcomeOf(p, "VMMIPC_RANK").origin, Origin::kRankRule);
  EXPECT_EQ(p.rank_source, "LOCAL_RANK");
  p = ParseWith({{"VMMIPC_RANK", "1"}, {"VMMIPC_RANK_FROM", "gpu"}});
  EXPECT_EQ(OutcomeOf(p, "VMMIPC_RANK").origin, Origin::kRankRule);
  EXPECT_EQ(p.rank, -1);
  p = ParseWith({{"VMMIPC_RANK", "1"}, {"LOCAL_RANK", "2"}});
  EXPECT_EQ(OutcomeOf(p, "VMMIPC_RANK").origin, Origin::kEnvironment);
  p = ParseWith({{"VMMIPC_RANK", "-1"}});
  EXPECT_EQ(OutcomeOf(p, "VMMIPC_RANK").origin, Origin::kEnvironment);
}

TEST(ParamsOutcome, ValuesAsTextReadBackAsTheValue) {
  const Params p = ParseWith({{"VMMIPC_LOG_LEVEL", "DEBUG"},
                              {"VMMIPC_SLOT_SIZE", "512G"},
                              {"VMMIPC_SOCKET_DIR", " /run/my dir "}});
  EXPECT_EQ(ValueText(p, ParamIndex("VMMIPC_LOG_LEVEL")), "debug");
  EXPECT_EQ(ValueText(p, ParamIndex("VMMIPC_SLOT_SIZE")), "0x8000000000");
  EXPECT_EQ(ValueText(p, ParamIndex("VMMIPC_SOCKET_DIR")), "/run/my dir");  // not quoted
  EXPECT_EQ(ValueText(p, ParamIndex("VMMIPC_ENABLE")), "1");
  EXPECT_EQ(ValueText(p, ParamIndex("VMMIPC_RANK")), "-1");
  EXPECT_EQ(ValueText(p, kParamCount), "");
  // Every default's text settles to itself.
  const Params defaults;
  for (size_t i = 0; i < kParamCount; ++i) {
    const Params again = ParseWith({{AllParams()[i].name, ValueText(defaults, i)}});
    EXPECT_TRUE(again.warnings.empty()) << AllParams()[i].name;
  }
}

TEST(ParamsOutcome, SlotsComeFromTheRankElseTheGpu) {
  Params p = ParseWith({});
  EXPECT_EQ(p.SlotFor(3), 3);
  EXPECT_EQ(p.SlotFor(-1), -1);
  EXPECT_EQ(p.SlotFor(static_cast<int>(kMaxRank)), kMaxRank);
  EXPECT_EQ(p.SlotFor(static_cast<int>(kMaxRank) + 1), -1);  // a handle could not say it
  p = ParseWith({{"LOCAL_RANK", "5"}});
  EXPECT_EQ(p.SlotFor(3), 5);
  EXPECT_EQ(p.SlotFor(-1), 5);
  p = ParseWith({{"VMMIPC_RANK_FROM", "env"}});
  EXPECT_EQ(p.SlotFor(3), -1);
  p = ParseWith({{"VMMIPC_RANK_FROM", "off"}, {"LOCAL_RANK", "5"}});
  EXPECT_EQ(p.SlotFor(3), -1);
}

}  // namespace
}  // namespace vmmipc::config
