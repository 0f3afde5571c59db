// The configuration table: value parsing, bad values warned and ignored, the
// rank fallbacks, and docs/configuration.md kept in step with params.def.
#include "config/params.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

namespace vmmipc::config {
namespace {

Params ParseWith(std::map<std::string, std::string> env) {
  return Parse([env = std::move(env)](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(Params, DefaultsServeAnEightGpuNode) {
  Params p = ParseWith({});
  EXPECT_TRUE(p.enable);
  EXPECT_EQ(p.log_level, log::Level::kWarn);
  EXPECT_EQ(p.rank, -1);
  EXPECT_EQ(p.rank_source, "none");
  EXPECT_EQ(p.zone_base, 0x300000000000ull);
  EXPECT_EQ(p.zone_fallback_base, 0x600000000000ull);
  EXPECT_EQ(p.zone_slots, 8);
  EXPECT_EQ(p.slot_size, 1ull << 40);
  EXPECT_EQ(p.timeout_ms, 5000);
  EXPECT_EQ(p.socket_dir, "");
  EXPECT_EQ(p.cuda_library, "libcuda.so.1");
  EXPECT_TRUE(p.force_posix_fd);
}

TEST(Params, ValuesAreParsed) {
  Params p = ParseWith({{"VMMIPC_ENABLE", "off"},
                        {"VMMIPC_LOG_LEVEL", "DEBUG"},
                        {"VMMIPC_RANK", " 5 "},
                        {"VMMIPC_ZONE_BASE", "0x400000000000"},
                        {"VMMIPC_SLOT_SIZE", "512GiB"},
                        {"VMMIPC_ZONE_SLOTS", "4"},
                        {"VMMIPC_TIMEOUT_MS", "250"},
                        {"VMMIPC_SOCKET_DIR", "/run/vmmipc"},
                        {"VMMIPC_FORCE_POSIX_FD", "false"}});
  EXPECT_FALSE(p.enable);
  EXPECT_EQ(p.log_level, log::Level::kDebug);
  EXPECT_EQ(p.rank, 5);
  EXPECT_EQ(p.rank_source, "VMMIPC_RANK");
  EXPECT_EQ(p.zone_base, 0x400000000000ull);
  EXPECT_EQ(p.slot_size, 512ull << 30);
  EXPECT_EQ(p.zone_slots, 4);
  EXPECT_EQ(p.timeout_ms, 250);
  EXPECT_EQ(p.socket_dir, "/run/vmmipc");
  EXPECT_FALSE(p.force_posix_fd);
}

TEST(Params, BadValuesAreIgnoredAndTheDefaultKept) {
  Params p = ParseWith({{"VMMIPC_ENABLE", "maybe"},
                        {"VMMIPC_LOG_LEVEL", "loud"},
                        {"VMMIPC_RANK", "seven"},
                        {"VMMIPC_ZONE_BASE", "0x300000000001"},  // not 2 MiB aligned
                        {"VMMIPC_SLOT_SIZE", "0"},
                        {"VMMIPC_ZONE_SLOTS", "-3"},
                        {"VMMIPC_TIMEOUT_MS", "0"},
                        {"VMMIPC_CUDA_LIBRARY", "  "},
                        {"VMMIPC_FORCE_POSIX_FD", ""}});
  Params d = ParseWith({});
  EXPECT_EQ(p.enable, d.enable);
  EXPECT_EQ(p.log_level, d.log_level);
  EXPECT_EQ(p.rank, -1);
  EXPECT_EQ(p.zone_base, d.zone_base);
  EXPECT_EQ(p.slot_size, d.slot_size);
  EXPECT_EQ(p.zone_slots, d.zone_slots);
  EXPECT_EQ(p.timeout_ms, d.timeout_ms);
  EXPECT_EQ(p.cuda_library, d.cuda_library);
  EXPECT_EQ(p.force_posix_fd, d.force_posix_fd);
}

TEST(Params, RankFallsBackToLocalRankThenRank) {
  EXPECT_EQ(ParseWith({{"LOCAL_RANK", "2"}, {"RANK", "9"}}).rank, 2);
  EXPECT_EQ(ParseWith({{"LOCAL_RANK", "2"}}).rank_source, "LOCAL_RANK");
  EXPECT_EQ(ParseWith({{"RANK", "9"}}).rank, 9);
  EXPECT_EQ(ParseWith({{"VMMIPC_RANK", "1"}, {"LOCAL_RANK", "2"}}).rank, 1);
  EXPECT_EQ(ParseWith({{"LOCAL_RANK", "x"}, {"RANK", "4"}}).rank, 4);
  EXPECT_EQ(ParseWith({{"LOCAL_RANK", "70000"}}).rank, -1);
}

TEST(Params, SizeParserRejectsJunk) {
  uint64_t v = 0;
  EXPECT_TRUE(ParseSize("1T", &v));
  EXPECT_EQ(v, 1ull << 40);
  EXPECT_TRUE(ParseSize("64m", &v));
  EXPECT_EQ(v, 64ull << 20);
  EXPECT_TRUE(ParseSize("0x10", &v));
  EXPECT_EQ(v, 16u);
  for (const char* bad : {"", "-1", "12Q", "1TT", "0xZZ", "99999999999999999999", "20000000T"})
    EXPECT_FALSE(ParseSize(bad, &v)) << bad;
}

// Sizes are decimal unless they start with 0x: a leading zero is not octal
// (strtoull's base 0 read "010T" as 8 TiB).
TEST(Params, SizesWithALeadingZeroAreDecimal) {
  uint64_t v = 0;
  EXPECT_TRUE(ParseSize("010T", &v));
  EXPECT_EQ(v, 10ull << 40);
  EXPECT_TRUE(ParseSize("010", &v));
  EXPECT_EQ(v, 10u);
  EXPECT_TRUE(ParseSize("08", &v));  // not even valid octal
  EXPECT_EQ(v, 8u);
  EXPECT_TRUE(ParseSize("0", &v));
  EXPECT_EQ(v, 0u);
  EXPECT_TRUE(ParseSize("0X1f", &v));
  EXPECT_EQ(v, 31u);
  for (const char* bad : {"0x", "0b101", "0o17", "1.5G", "0x-1", "0x0x10", "0x 1", "- 1"})
    EXPECT_FALSE(ParseSize(bad, &v)) << bad;
  EXPECT_EQ(ParseWith({{"VMMIPC_ZONE_BASE", "048T"}}).zone_base, 48ull << 40);
}

// docs/configuration.md lists every parameter with its default, and nothing else.
TEST(Params, ConfigurationDocMatchesTheTable) {
  std::ifstream file(std::string(VMMIPC_SOURCE_DIR) + "/docs/configuration.md");
  ASSERT_TRUE(file.good());
  std::stringstream text;
  text << file.rdbuf();
  const std::string doc = text.str();
  std::set<std::string> names;
  for (const ParamSpec& spec : AllParams()) {
    names.insert(spec.name);
    const std::string row = std::string("| `") + spec.name + "` | `" + spec.default_text + "` |";
    EXPECT_NE(doc.find(row), std::string::npos) << "missing row starting: " << row;
  }
  std::regex mention("VMMIPC_[A-Z_]+[A-Z]");
  for (auto it = std::sregex_iterator(doc.begin(), doc.end(), mention);
       it != std::sregex_iterator(); ++it)
    EXPECT_TRUE(names.count(it->str())) << it->str() << " is documented but not declared";
}

}  // namespace
}  // namespace vmmipc::config
