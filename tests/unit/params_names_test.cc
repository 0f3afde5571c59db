// Names in the environment that look like vmmipc's but are none of its
// variables: the likely name (edit distance against the declared and the old
// names), and the one warning each that Parse gives.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/params.h"

namespace vmmipc::config {
namespace {

Params ParseNames(const std::vector<std::string>& names) {
  return Parse([](const char*) -> const char* { return "1"; }, names);
}

TEST(ParamsNames, TyposGetTheLikelyName) {
  EXPECT_EQ(SuggestName("VMMIPC_LOGLEVEL"), "VMMIPC_LOG_LEVEL");   // a missing underscore
  EXPECT_EQ(SuggestName("VMMIPC_RANK_FORM"), "VMMIPC_RANK_FROM");  // two letters swapped
  EXPECT_EQ(SuggestName("VMMIPC_TIMEOUT"), "VMMIPC_TIMEOUT_MS");
  EXPECT_EQ(SuggestName("VMMIPC_ZONE_SLOT"), "VMMIPC_ZONE_SLOTS");
  EXPECT_EQ(SuggestName("vmmipc_rank"), "VMMIPC_RANK");  // names are case-sensitive
  EXPECT_EQ(SuggestName("VMMIPC_WARM_CONNECTION"), "VMMIPC_WARM_CONNECTIONS");
  // Near an old name: the variable's name now.
  EXPECT_EQ(SuggestName("VMMIPC_EXPORT_ANCHORS"), "VMMIPC_EXPORT_KEEPALIVE");
  // Nothing near: no guess.
  EXPECT_EQ(SuggestName("VMMIPC_DEBUG"), "");
  EXPECT_EQ(SuggestName("VMMIPC_X"), "");
  EXPECT_EQ(SuggestName("NOT_OURS"), "");
  // Every declared name is its own best match.
  for (const ParamSpec& spec : AllParams()) EXPECT_EQ(SuggestName(spec.name), spec.name);
}

TEST(ParamsNames, EachUnknownNameGetsOneWarning) {
  const Params p = ParseNames({"PATH", "VMMIPC_LOGLEVEL", "VMMIPC_RANK", "VMMIPC_EXPORT_ANCHOR",
                               "vmmipc_stats", "VMMIPC_FOO", "VMMIPC_LOGLEVEL"});
  EXPECT_EQ(p.unknown, (std::vector<std::string>{"VMMIPC_FOO", "VMMIPC_LOGLEVEL", "vmmipc_stats"}));
  std::vector<std::string> about_names;
  for (const std::string& warning : p.warnings)
    if (warning.find("not a vmmipc variable") != std::string::npos) about_names.push_back(warning);
  EXPECT_EQ(about_names,
            (std::vector<std::string>{
                "ignoring VMMIPC_FOO='1': not a vmmipc variable (docs/configuration.md lists them)",
                "ignoring VMMIPC_LOGLEVEL='1': not a vmmipc variable; did you mean "
                "VMMIPC_LOG_LEVEL?",
                "ignoring vmmipc_stats='1': not a vmmipc variable; did you mean VMMIPC_STATS?"}));
  const Params near_old = ParseNames({"VMMIPC_EXPORT_ANCHORS"});
  ASSERT_FALSE(near_old.warnings.empty());
  EXPECT_NE(near_old.warnings.back().find(
                "did you mean VMMIPC_EXPORT_KEEPALIVE (once VMMIPC_EXPORT_ANCHOR)?"),
            std::string::npos)
      << near_old.warnings.back();
  EXPECT_TRUE(ParseNames({"PATH", "HOME", "LOCAL_RANK"}).unknown.empty());
}

// Each rule says in its own words what it refuses, and the docs say what it takes.
TEST(ParamsRules, RefusalsAndDescriptionsComeFromOneRule) {
  EXPECT_EQ(Violation(Between(1, 64), int64_t{0}), "must be between 1 and 64");
  EXPECT_EQ(Violation(Between(1, 64), int64_t{64}), "");
  EXPECT_EQ(Violation(PositiveMultipleOf(kLayoutAlignment), uint64_t{0}),
            "must be a positive multiple of 2 MiB");
  EXPECT_EQ(Violation(MultipleOf(kLayoutAlignment), uint64_t{0}), "");
  EXPECT_EQ(Violation(MultipleOf(kLayoutAlignment), uint64_t{3}), "must be a multiple of 2 MiB");
  EXPECT_EQ(Violation(OneOf("auto env gpu off"), std::string("x")),
            "must be auto, env, gpu or off");
  EXPECT_EQ(Violation(NotEmpty(), std::string()), "must not be empty");
  EXPECT_EQ(DescribeValues(Kind::kInt, Between(1, 64)), "1 to 64");
  EXPECT_EQ(DescribeValues(Kind::kString, OneOf("auto env")), "`auto` or `env`");
  EXPECT_EQ(DescribeValues(Kind::kLogLevel, Any()),
            "`trace`, `debug`, `info`, `warn` (`warning`), `error` or `off` (`none`) (any case)");
  EXPECT_EQ(DescribeValues(Kind::kBool, Any()),
            "`1`, `true`, `yes` or `on`; `0`, `false`, `no` or `off` (any case)");
  // The spellings the docs list are the ones the parsers take.
  for (const log::LevelSpelling& spelling : log::LevelSpellings()) {
    log::Level level = log::Level::kTrace;
    EXPECT_TRUE(log::ParseLevel(spelling.name, &level));
    EXPECT_EQ(level, spelling.level);
  }
  for (const char* word : kTrueWords) {
    bool value = false;
    EXPECT_TRUE(ParseBool(word, &value) && value) << word;
  }
  // Every variable's rule holds for its default, and the parse refuses with its words.
  const Params slots = Parse(
      [](const char* n) -> const char* {
        return std::string(n) == "VMMIPC_WARM_CONNECTIONS" ? "5000" : nullptr;
      },
      {});
  ASSERT_EQ(slots.warnings.size(), 1u);
  EXPECT_EQ(slots.warnings[0],
            "ignoring VMMIPC_WARM_CONNECTIONS='5000': must be between 0 and 4096; using the "
            "default 64");
  EXPECT_EQ(slots.outcomes[ParamIndex("VMMIPC_WARM_CONNECTIONS")].reason,
            "must be between 0 and 4096");
}

}  // namespace
}  // namespace vmmipc::config
