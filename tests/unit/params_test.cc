// The configuration table: value parsing, bad values warned and ignored, the
// rank fallbacks, and docs/configuration.md kept in step with params.def.
#include "config/params.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "params_test_support.h"

namespace vmmipc::config {
namespace {

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
  // Correct for a memory saver's peers without a setting (issue 43): follow
  // on; ahead, which only trades speed, off.
  EXPECT_TRUE(p.follow);
  EXPECT_FALSE(p.ahead);
}

// Params' fields get their defaults by parsing params.def's text, which must
// therefore parse, pass the checks and give the default-constructed value.
TEST(Params, EveryDefaultTextParsesToTheDefault) {
  EXPECT_EQ(Describe(Params()).rfind("config: all defaults;", 0), 0u);
  for (const ParamSpec& spec : AllParams()) {
    const Params p = ParseWith({{spec.name, spec.default_text}});
    EXPECT_TRUE(p.warnings.empty()) << spec.name << ": " << p.warnings.front();
    EXPECT_EQ(Describe(p).rfind("config: all defaults;", 0), 0u) << spec.name;
  }
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

// The master switch read alone, before the configuration (at load time): as
// Parse reads it, invalid values included.
TEST(Params, TheSwitchReadAloneReadsAsParseDoes) {
  const char* saved = std::getenv("VMMIPC_ENABLE");
  const std::string kept = saved != nullptr ? saved : "";
  for (const char* text : {"0", "off", " false ", "1", "on", "junk", ""}) {
    setenv("VMMIPC_ENABLE", text, 1);
    EXPECT_EQ(EnabledByEnvironment(), Parse([](const char* n) { return std::getenv(n); }).enable)
        << "'" << text << "'";
  }
  unsetenv("VMMIPC_ENABLE");
  EXPECT_TRUE(EnabledByEnvironment());
  if (saved != nullptr) setenv("VMMIPC_ENABLE", kept.c_str(), 1);
}

TEST(Params, RankFallsBackToLocalRankThenRank) {
  EXPECT_EQ(ParseWith({{"LOCAL_RANK", "2"}, {"RANK", "9"}}).rank, 2);
  EXPECT_EQ(ParseWith({{"LOCAL_RANK", "2"}}).rank_source, "LOCAL_RANK");
  EXPECT_EQ(ParseWith({{"RANK", "9"}}).rank, 9);
  EXPECT_EQ(ParseWith({{"VMMIPC_RANK", "1"}, {"LOCAL_RANK", "2"}}).rank, 1);
  EXPECT_EQ(ParseWith({{"LOCAL_RANK", "x"}, {"RANK", "4"}}).rank, 4);
  EXPECT_EQ(ParseWith({{"LOCAL_RANK", "70000"}}).rank, -1);
}

// A refused VMMIPC_RANK is no rank at all: the fallbacks still apply, and the
// warning says so rather than naming -1 as if it were a value.
TEST(Params, ARefusedRankIsTreatedAsUnset) {
  Params p = ParseWith({{"VMMIPC_RANK", "abc"}, {"LOCAL_RANK", "3"}});
  EXPECT_EQ(p.rank, 3);
  EXPECT_EQ(p.rank_source, "LOCAL_RANK");
  ASSERT_EQ(p.warnings.size(), 1u);
  EXPECT_EQ(p.warnings[0],
            "ignoring VMMIPC_RANK='abc': not a whole number; treated as unset (LOCAL_RANK, RANK, "
            "then the GPU)");
  // Other variables still name their default.
  EXPECT_EQ(ParseWith({{"VMMIPC_TIMEOUT_MS", "x"}}).warnings.at(0),
            "ignoring VMMIPC_TIMEOUT_MS='x': not a whole number; using the default 5000");
}

// Settings valid alone that do nothing together are warned about by Parse, so
// the library's log and vmmipc-config (--check) carry the same line.
TEST(Params, SettingsThatDoNothingTogetherAreWarnedAbout) {
  const std::string line =
      "VMMIPC_AHEAD=1 does nothing with VMMIPC_FOLLOW=0 (announcements come over the follow "
      "connection, and its events drop what was mapped ahead when the exporter unmaps it)";
  EXPECT_EQ(ParseWith({{"VMMIPC_AHEAD", "1"}, {"VMMIPC_FOLLOW", "0"}}).warnings,
            std::vector<std::string>{line});
  EXPECT_TRUE(ParseWith({{"VMMIPC_AHEAD", "1"}, {"VMMIPC_FOLLOW", "1"}}).warnings.empty());
  EXPECT_TRUE(ParseWith({{"VMMIPC_AHEAD", "1"}}).warnings.empty());  // follow is the default
  EXPECT_TRUE(ParseWith({{"VMMIPC_FOLLOW", "0"}}).warnings.empty());
}

TEST(Params, RankFromPinsTheSource) {
  Params automatic = ParseWith({});
  EXPECT_EQ(automatic.rank_from, "auto");
  EXPECT_TRUE(automatic.slot_from_gpu());
  EXPECT_FALSE(automatic.arena_wanted());  // a slot from the GPU under auto: no arena
  Params ranked = ParseWith({{"LOCAL_RANK", "2"}});
  EXPECT_FALSE(ranked.slot_from_gpu());
  EXPECT_TRUE(ranked.arena_wanted());
  // gpu: every rank variable is ignored, and the arena is on.
  Params gpu = ParseWith({{"VMMIPC_RANK_FROM", "gpu"}, {"VMMIPC_RANK", "3"}, {"LOCAL_RANK", "2"}});
  EXPECT_EQ(gpu.rank, -1);
  EXPECT_EQ(gpu.rank_source, "none");
  EXPECT_TRUE(gpu.slot_from_gpu());
  EXPECT_TRUE(gpu.arena_wanted());
  EXPECT_FALSE(ParseWith({{"VMMIPC_RANK_FROM", "gpu"}, {"VMMIPC_ARENA", "0"}}).arena_wanted());
  // env: the variables only.
  Params env = ParseWith({{"VMMIPC_RANK_FROM", "env"}});
  EXPECT_FALSE(env.slot_from_gpu());
  EXPECT_EQ(ParseWith({{"VMMIPC_RANK_FROM", "env"}, {"RANK", "4"}}).rank, 4);
  // off: nothing, not even VMMIPC_RANK.
  Params off = ParseWith({{"VMMIPC_RANK_FROM", "off"}, {"VMMIPC_RANK", "3"}});
  EXPECT_EQ(off.rank, -1);
  EXPECT_FALSE(off.slot_from_gpu());
  EXPECT_FALSE(off.arena_wanted());
  // Anything else is refused and auto stays.
  EXPECT_EQ(ParseWith({{"VMMIPC_RANK_FROM", "GPU0"}}).rank_from, "auto");
  EXPECT_EQ(ParseWith({{"VMMIPC_RANK_FROM", " gpu "}}).rank_from, "gpu");
}

TEST(Params, InteriorHandlesTakesItsThreeRules) {
  EXPECT_EQ(ParseWith({}).interior_handles, "auto");
  for (const char* rule : {"auto", "address", "allocation"})
    EXPECT_EQ(ParseWith({{"VMMIPC_INTERIOR_HANDLES", rule}}).interior_handles, rule);
  // Anything else is refused and auto stays.
  EXPECT_EQ(ParseWith({{"VMMIPC_INTERIOR_HANDLES", "base"}}).interior_handles, "auto");
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

// --- address layout -------------------------------------------------------------------------

// Parses `env` and returns its warnings, one line each. Parse itself logs
// nothing (config::Get logs them once the rank is known).
std::string ParseLogged(std::map<std::string, std::string> env, Params* out) {
  log::SetLevel(log::Level::kWarn);
  ::testing::internal::CaptureStderr();
  *out = ParseWith(std::move(env));
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  std::string lines;
  for (const std::string& warning : out->warnings) lines += warning + "\n";
  return lines;
}

// What Parse promises of every layout it returns.
void ExpectSoundLayout(const Params& p, const std::string& context) {
  SCOPED_TRACE(context);
  uint64_t zone = 0;
  ASSERT_FALSE(__builtin_mul_overflow(static_cast<uint64_t>(p.zone_slots), p.slot_size, &zone));
  ASSERT_LE(zone, kUserAddressEnd);
  struct Part {
    const char* what;
    uint64_t base, size;
  };
  std::vector<Part> parts;
  if (p.zone_base != 0) parts.push_back({"zone", p.zone_base, zone});
  if (p.zone_fallback_base != 0) parts.push_back({"fallback", p.zone_fallback_base, zone});
  if (p.arena) {
    EXPECT_LE(p.arena_size, p.slot_size);
    parts.push_back({"arena", p.arena_base, p.arena_size});
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    EXPECT_LE(parts[i].size, kUserAddressEnd) << parts[i].what;
    EXPECT_LE(parts[i].base, kUserAddressEnd - parts[i].size) << parts[i].what;
    for (size_t j = i + 1; j < parts.size(); ++j)
      EXPECT_FALSE(parts[i].base < parts[j].base + parts[j].size &&
                   parts[j].base < parts[i].base + parts[i].size)
          << parts[i].what << " overlaps " << parts[j].what;
  }
}

// The review's case: 2 x 0x8000000002000000 wrapped to a 64 MiB zone, so rank
// 1's slot began 2^63 + 32 MiB past the base and imports landed elsewhere.
TEST(ParamsLayout, ZoneSizeThatOverflowsFallsBackToTheDefaultGeometry) {
  Params p;
  std::string log =
      ParseLogged({{"VMMIPC_ZONE_SLOTS", "2"}, {"VMMIPC_SLOT_SIZE", "0x8000000002000000"}}, &p);
  EXPECT_EQ(p.zone_slots, 8);
  EXPECT_EQ(p.slot_size, 1ull << 40);
  EXPECT_NE(log.find("ignoring VMMIPC_ZONE_SLOTS=2 and VMMIPC_SLOT_SIZE=0x8000000002000000: the "
                     "import zone (slots x slot size) overflows 64 bits; using the defaults 8 x "
                     "0x10000000000"),
            std::string::npos)
      << log;
  ExpectSoundLayout(p, "overflow");
  // No wrap-around, but more than the whole user address space.
  log = ParseLogged({{"VMMIPC_ZONE_SLOTS", "65534"}}, &p);
  EXPECT_EQ(p.zone_slots, 8);
  EXPECT_NE(log.find("is 64.0 PiB, more than the 47-bit user address space"), std::string::npos)
      << log;
}

TEST(ParamsLayout, ZonePastTheTopOfUserSpaceUsesTheDefaultBase) {
  for (const char* base : {"0x7f0000000000", "0xfffffffffe000000", "0x800000000000"}) {
    Params p;
    const std::string log = ParseLogged({{"VMMIPC_ZONE_BASE", base}}, &p);
    EXPECT_EQ(p.zone_base, 0x300000000000ull) << base;
    EXPECT_NE(
        log.find(std::string("ignoring VMMIPC_ZONE_BASE=") + base + ": the import zone [" + base +
                 ", +8 TiB) ends past "
                 "0x800000000000, the top of the 47-bit user address space; using the "
                 "default 0x300000000000"),
        std::string::npos)
        << log;
    ExpectSoundLayout(p, base);
  }
}

TEST(ParamsLayout, PartsWhoseDefaultsDoNotFitEitherAreTurnedOff) {
  // 100 slots of 1 TiB fit from 16 TiB, but then neither the fallback zone
  // nor the arena can go anywhere of their defaults.
  Params p;
  std::string log =
      ParseLogged({{"VMMIPC_ZONE_SLOTS", "100"}, {"VMMIPC_ZONE_BASE", "0x100000000000"}}, &p);
  EXPECT_EQ(p.zone_base, 0x100000000000ull);
  EXPECT_EQ(p.zone_slots, 100);
  EXPECT_EQ(p.zone_fallback_base, 0u);
  EXPECT_FALSE(p.arena);
  EXPECT_NE(log.find("VMMIPC_ZONE_FALLBACK_BASE=0x600000000000 (the default): the fallback zone "
                     "[0x600000000000, +100 TiB) ends past"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("; no fallback zone"), std::string::npos) << log;
  EXPECT_NE(log.find("VMMIPC_ARENA_BASE=0x200000000000 and VMMIPC_ARENA_SIZE=0x10000000000 (the "
                     "default): the export arena [0x200000000000, +1 TiB) overlaps the "
                     "import zone [0x100000000000, +100 TiB); export arena off"),
            std::string::npos)
      << log;
  ExpectSoundLayout(p, "100 slots at 16 TiB");
  // The zone itself: its default base does not fit 100 slots either.
  log = ParseLogged({{"VMMIPC_ZONE_SLOTS", "100"}, {"VMMIPC_ZONE_BASE", "0x500000000000"}}, &p);
  EXPECT_EQ(p.zone_base, 0u);
  EXPECT_NE(log.find("ignoring VMMIPC_ZONE_BASE=0x500000000000: the import zone [0x500000000000, "
                     "+100 TiB) ends past"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("the default 0x300000000000 does not fit either (the import zone "
                     "[0x300000000000, +100 TiB) ends past"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("; no import zone at VMMIPC_ZONE_BASE"), std::string::npos) << log;
  ExpectSoundLayout(p, "100 slots at 80 TiB");
}

TEST(ParamsLayout, FallbackZoneMustNotOverlapTheZone) {
  Params p;
  const std::string log = ParseLogged({{"VMMIPC_ZONE_FALLBACK_BASE", "0x340000000000"}}, &p);
  EXPECT_EQ(p.zone_fallback_base, 0x600000000000ull);
  EXPECT_NE(log.find("ignoring VMMIPC_ZONE_FALLBACK_BASE=0x340000000000: the fallback zone "
                     "[0x340000000000, +8 TiB) overlaps the import zone "
                     "[0x300000000000, +8 TiB); using the default 0x600000000000"),
            std::string::npos)
      << log;
  // 0 still means no fallback zone, without a word.
  EXPECT_EQ(ParseLogged({{"VMMIPC_ZONE_FALLBACK_BASE", "0"}}, &p), "");
  EXPECT_EQ(p.zone_fallback_base, 0u);
}

TEST(ParamsLayout, ArenaMustFitASlotAndOverlapNeitherZone) {
  Params p;
  // Inside the import zone: the arena goes back to its default place.
  std::string log = ParseLogged({{"VMMIPC_ARENA_BASE", "0x300000000000"}}, &p);
  EXPECT_TRUE(p.arena);
  EXPECT_EQ(p.arena_base, 0x200000000000ull);
  EXPECT_NE(log.find("ignoring VMMIPC_ARENA_BASE=0x300000000000 and VMMIPC_ARENA_SIZE="
                     "0x10000000000: the export arena [0x300000000000, +1 TiB) overlaps "
                     "the import zone [0x300000000000, +8 TiB); using the default "
                     "0x200000000000 and 0x10000000000"),
            std::string::npos)
      << log;
  // Inside the fallback zone, and past the top.
  EXPECT_EQ(ParseWith({{"VMMIPC_ARENA_BASE", "0x600000000000"}}).arena_base, 0x200000000000ull);
  EXPECT_EQ(ParseWith({{"VMMIPC_ARENA_BASE", "0x7fffffe00000"}}).arena_base, 0x200000000000ull);
  // Larger than a slot: the default size.
  log = ParseLogged({{"VMMIPC_ARENA_SIZE", "2T"}}, &p);
  EXPECT_TRUE(p.arena);
  EXPECT_EQ(p.arena_size, 1ull << 40);
  EXPECT_NE(log.find("the export arena's size 2 TiB is larger than VMMIPC_SLOT_SIZE (1 TiB)"),
            std::string::npos)
      << log;
  // Slots smaller than the default arena: no arena at all.
  log = ParseLogged({{"VMMIPC_SLOT_SIZE", "512G"}}, &p);
  EXPECT_FALSE(p.arena);
  EXPECT_NE(log.find("(the default): the export arena's size 1 TiB is larger than "
                     "VMMIPC_SLOT_SIZE (512 GiB), so it could not mirror into one importer "
                     "slot; export arena off"),
            std::string::npos)
      << log;
  // An arena that is off anyway is not checked.
  EXPECT_EQ(ParseLogged({{"VMMIPC_ARENA", "0"}, {"VMMIPC_ARENA_BASE", "0x300000000000"}}, &p), "");
  EXPECT_EQ(p.arena_base, 0x300000000000ull);
}

// The layout of the ThreadSanitizer stage (.ci/run), and the defaults, are kept as they are.
TEST(ParamsLayout, SoundLayoutsAreKeptWithoutAWord) {
  Params p;
  EXPECT_EQ(ParseLogged({{"VMMIPC_ZONE_BASE", "0x1000000000"},
                         {"VMMIPC_SLOT_SIZE", "0x400000000"},
                         {"VMMIPC_ZONE_SLOTS", "8"},
                         {"VMMIPC_ZONE_FALLBACK_BASE", "0x4000000000"},
                         {"VMMIPC_ARENA_BASE", "0x6800000000"},
                         {"VMMIPC_ARENA_SIZE", "0x400000000"}},
                        &p),
            "");
  EXPECT_EQ(p.zone_base, 0x1000000000ull);
  EXPECT_EQ(p.zone_fallback_base, 0x4000000000ull);
  EXPECT_EQ(p.arena_base, 0x6800000000ull);
  EXPECT_TRUE(p.arena);
  EXPECT_EQ(ParseLogged({}, &p), "");
  ExpectSoundLayout(p, "defaults");
}

// Every combination of troublesome values ends in a sound layout.
TEST(ParamsLayout, EveryCombinationEndsSound) {
  log::SetLevel(log::Level::kOff);
  const char* slots[] = {"1", "2", "8", "100", "65534"};
  const char* slot_sizes[] = {"2M", "512G", "1T", "0x8000000002000000", "0x7ffffffffe00000"};
  const char* bases[] = {"0", "0x200000000000", "0x300000000000", "0x7fffffe00000",
                         "0xffffffffffe00000"};
  const char* arena_sizes[] = {"2M", "1T", "2T", "0xffffffffffe00000"};
  for (const char* s : slots)
    for (const char* ss : slot_sizes)
      for (const char* zb : bases)
        for (const char* fb : bases)
          for (const char* ab : bases)
            for (const char* as : arena_sizes) {
              const Params p = ParseWith({{"VMMIPC_ZONE_SLOTS", s},
                                          {"VMMIPC_SLOT_SIZE", ss},
                                          {"VMMIPC_ZONE_BASE", zb},
                                          {"VMMIPC_ZONE_FALLBACK_BASE", fb},
                                          {"VMMIPC_ARENA_BASE", ab},
                                          {"VMMIPC_ARENA_SIZE", as}});
              ExpectSoundLayout(p, fmt::format("{} {} {} {} {} {}", s, ss, zb, fb, ab, as));
              if (::testing::Test::HasFatalFailure() || ::testing::Test::HasNonfatalFailure())
                return;
            }
  log::SetLevel(log::Level::kWarn);
}

// --- what a process says about its configuration ----------------------------------------------

TEST(ParamsDescribe, NamesWhatDiffersFromTheDefaultsAndWhereTheRankCameFrom) {
  EXPECT_EQ(Describe(ParseWith(
                {{"VMMIPC_LOG_LEVEL", "info"}, {"VMMIPC_STATS", "1"}, {"LOCAL_RANK", "0"}})),
            "config: VMMIPC_LOG_LEVEL=info VMMIPC_STATS=1 (others default); rank 0 from "
            "LOCAL_RANK");
  EXPECT_EQ(Describe(ParseWith({})),
            "config: all defaults; rank slot from the GPU on first export (no rank variable)");
  // A value equal to its default, and a bad value (the default stays), are not listed; the
  // rank is in its own part, not in the list.
  EXPECT_EQ(Describe(ParseWith(
                {{"VMMIPC_TIMEOUT_MS", "5000"}, {"VMMIPC_ZONE_SLOTS", "0"}, {"VMMIPC_RANK", "3"}})),
            "config: all defaults; rank 3 from VMMIPC_RANK");
  // The values in effect: sizes in hex, strings quoted when they hold blanks, the layout as
  // settled (slots of 512 GiB leave no room for the default arena: it is off).
  EXPECT_EQ(Describe(ParseWith({{"VMMIPC_SLOT_SIZE", "512G"},
                                {"VMMIPC_SOCKET_DIR", "/run/my dir"},
                                {"VMMIPC_RANK_FROM", "off"},
                                {"VMMIPC_LOG_FILE", "/tmp/v.%h.%p.log"}})),
            "config: VMMIPC_LOG_FILE=/tmp/v.%h.%p.log VMMIPC_RANK_FROM=off "
            "VMMIPC_SLOT_SIZE=0x8000000000 VMMIPC_SOCKET_DIR='/run/my dir' VMMIPC_ARENA=0 "
            "(others default); unranked (VMMIPC_RANK_FROM=off)");
  EXPECT_EQ(Describe(ParseWith({{"VMMIPC_RANK_FROM", "env"}})),
            "config: VMMIPC_RANK_FROM=env (others default); unranked (no rank variable)");
  EXPECT_EQ(Describe(ParseWith({{"VMMIPC_RANK_FROM", "gpu"}, {"LOCAL_RANK", "1"}})),
            "config: VMMIPC_RANK_FROM=gpu (others default); rank slot from the GPU on first "
            "export (VMMIPC_RANK_FROM=gpu)");
}

// The warnings about the environment are logged by Get(), after the log has
// the rank: with VMMIPC_RANK=0 they say "rank 0", not "unranked". In a child
// process: Get() reads the environment once per process.
TEST(ParamsDeathTest, WarningsAboutTheEnvironmentCarryTheRank) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        unsetenv("VMMIPC_LOG_FILE");
        unsetenv("VMMIPC_LOG_LEVEL");
        unsetenv("VMMIPC_RANK_FROM");
        setenv("VMMIPC_RANK", "0", 1);
        setenv("VMMIPC_TIMEOUT_MS", "0", 1);
        Get();
        std::exit(0);
      },
      ::testing::ExitedWithCode(0),
      "^\\[vmmipc pid [0-9]+ rank 0\\] warning: ignoring VMMIPC_TIMEOUT_MS='0': must be "
      "between 1 and 3600000; using the default 5000\n$");
  // A rank from LOCAL_RANK, and a warning about RANK itself.
  EXPECT_EXIT(
      {
        unsetenv("VMMIPC_LOG_FILE");
        unsetenv("VMMIPC_LOG_LEVEL");
        unsetenv("VMMIPC_RANK_FROM");
        unsetenv("VMMIPC_RANK");
        setenv("LOCAL_RANK", "x", 1);
        setenv("RANK", "5", 1);
        Get();
        std::exit(0);
      },
      ::testing::ExitedWithCode(0),
      "^\\[vmmipc pid [0-9]+ rank 5\\] warning: ignoring LOCAL_RANK='x': not a rank between "
      "0 and 65534\n$");
}

// The warnings go where VMMIPC_LOG_FILE says, and VMMIPC_LOG_LEVEL applies to them.
TEST(ParamsDeathTest, WarningsAboutTheEnvironmentFollowTheLogFileAndLevel) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // The death test's child runs this function again: it names the file by its
  // parent's pid, which is this process's.
  const std::string pattern = ::testing::TempDir() + "vmmipc-params-%p.log";
  const std::string path = log::ExpandFileName(pattern, "", getpid());
  std::remove(path.c_str());
  EXPECT_EXIT(
      {
        setenv("VMMIPC_LOG_FILE", log::ExpandFileName(pattern, "", getppid()).c_str(), 1);
        unsetenv("VMMIPC_LOG_LEVEL");
        setenv("VMMIPC_RANK", "2", 1);
        setenv("VMMIPC_ARENA_SIZE", "3", 1);
        Get();
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "^$");
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find(" rank 2] warning: ignoring VMMIPC_ARENA_SIZE='3'"), std::string::npos)
      << text.str();
  std::remove(path.c_str());
  EXPECT_EXIT(
      {
        unsetenv("VMMIPC_LOG_FILE");
        setenv("VMMIPC_LOG_LEVEL", "error", 1);
        setenv("VMMIPC_ARENA_SIZE", "3", 1);
        Get();
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "^$");
}

// docs/configuration.md lists every parameter with its default, and nothing else
// (its table is vmmipc-config --markdown: tests/scripts/test_vmmipc_run.py).
TEST(Params, ConfigurationDocMatchesTheTable) {
  std::ifstream file(std::string(VMMIPC_SOURCE_DIR) + "/docs/configuration.md");
  ASSERT_TRUE(file.good());
  std::stringstream text;
  text << file.rdbuf();
  const std::string doc = text.str();
  // The misspelt name of the unknown-name warning's example: no variable, on purpose.
  std::set<std::string> names = {"VMMIPC_LOGLEVEL"};
  EXPECT_EQ(ParamIndex("VMMIPC_LOGLEVEL"), kParamCount);
  for (const RenamedParam& renamed : RenamedParams()) names.insert(renamed.old_name);
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

// A renamed variable's old name still works, with one warning; where the new
// name is set too, the new one wins and the old one is named as ignored.
TEST(Params, OldNameOfARenamedVariableStillWorks) {
  ASSERT_FALSE(RenamedParams().empty());
  for (const RenamedParam& renamed : RenamedParams())
    EXPECT_NE(ParamIndex(renamed.name), kParamCount) << renamed.name << " is not declared";
  Params old_only = ParseWith({{"VMMIPC_EXPORT_ANCHOR", "0"}});
  EXPECT_FALSE(old_only.export_keepalive);
  ASSERT_EQ(old_only.warnings.size(), 1u);
  EXPECT_NE(old_only.warnings[0].find("VMMIPC_EXPORT_ANCHOR is the old name of "
                                      "VMMIPC_EXPORT_KEEPALIVE"),
            std::string::npos)
      << old_only.warnings[0];
  EXPECT_EQ(old_only.outcomes[ParamIndex("VMMIPC_EXPORT_KEEPALIVE")].origin, Origin::kEnvironment);

  Params both = ParseWith({{"VMMIPC_EXPORT_ANCHOR", "0"}, {"VMMIPC_EXPORT_KEEPALIVE", "1"}});
  EXPECT_TRUE(both.export_keepalive);
  ASSERT_EQ(both.warnings.size(), 1u);
  EXPECT_NE(both.warnings[0].find("ignoring VMMIPC_EXPORT_ANCHOR='0'"), std::string::npos)
      << both.warnings[0];

  Params bad = ParseWith({{"VMMIPC_EXPORT_ANCHOR", "maybe"}});
  EXPECT_TRUE(bad.export_keepalive);   // the default stays
  EXPECT_EQ(bad.warnings.size(), 2u);  // the old name, and the value
  EXPECT_TRUE(ParseWith({}).warnings.empty());
}

// VMMIPC_PREFETCH's levels: 3 (map ahead) lives on as VMMIPC_AHEAD=1; 1 and
// 2 were removed: nothing is prefetched, and the warning says so.
TEST(Params, TheRetiredPrefetchLevelsReadAsAhead) {
  Params three = ParseWith({{"VMMIPC_PREFETCH", "3"}});
  EXPECT_TRUE(three.ahead);
  ASSERT_EQ(three.warnings.size(), 1u) << three.warnings.back();
  EXPECT_NE(three.warnings[0].find("VMMIPC_PREFETCH is the old name of VMMIPC_AHEAD"),
            std::string::npos)
      << three.warnings[0];
  for (const char* level : {"1", "2"}) {
    Params old = ParseWith({{"VMMIPC_PREFETCH", level}});
    EXPECT_FALSE(old.ahead) << level;
    ASSERT_EQ(old.warnings.size(), 2u) << level;
    EXPECT_NE(old.warnings[1].find("prefetch levels 1 and 2 were removed"), std::string::npos)
        << old.warnings[1];
  }
  Params zero = ParseWith({{"VMMIPC_PREFETCH", "0"}});
  EXPECT_FALSE(zero.ahead);
  EXPECT_EQ(zero.warnings.size(), 1u);  // the old name only
  Params both = ParseWith({{"VMMIPC_PREFETCH", "3"}, {"VMMIPC_AHEAD", "0"}});
  EXPECT_FALSE(both.ahead);
  ASSERT_EQ(both.warnings.size(), 1u);
  EXPECT_NE(both.warnings[0].find("ignoring VMMIPC_PREFETCH='3'"), std::string::npos);
}

// The user's table holds what users set; the rest is marked for tests.
TEST(Params, TheSettingsForTestsAreMarkedApart) {
  std::set<std::string> for_tests;
  size_t users = 0;
  for (const ParamSpec& spec : AllParams()) {
    if (spec.for_tests)
      for_tests.insert(spec.name);
    else
      ++users;
  }
  EXPECT_EQ(for_tests, (std::set<std::string>{"VMMIPC_ZONE_ANCHORS", "VMMIPC_WARM_CONNECTIONS",
                                              "VMMIPC_EXPORT_FD_CACHE", "VMMIPC_EXPORT_KEEPALIVE",
                                              "VMMIPC_EXPORT_IN_GET"}));
  // 21, and VMMIPC_BACKGROUND_EXPORT: a speed setting users choose by its
  // measured gain and cost (off by default: it costs an fd per mapped chunk).
  EXPECT_LE(users, 22u);
}

}  // namespace
}  // namespace vmmipc::config
