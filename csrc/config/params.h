// The configuration of vmmipc: every VMMIPC_* variable is declared once in
// params.def (name, kind, default, doc), from which the fields of Params and
// their defaults are generated; parsed once, and read through Get().
// Invalid values are warned about and ignored (the default stays); so is an
// address layout (import zone, fallback zone, export arena) that does not fit.
// Also the one-line summary of the effective configuration (Describe), and
// where each value came from (Params::outcomes, which vmmipc-config shows).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/log.h"
#include "common/timeout.h"
#include "config/values.h"

namespace vmmipc::config {

enum class Kind { kBool, kInt, kSize, kString, kLogLevel };

// The highest rank slot: a handle carries the slot in 16 bits, and 0xFFFF
// means unranked (ledger::kUnranked).
inline constexpr int64_t kMaxRank = 0xFFFE;

// What the layout's bases and sizes must be multiples of: the VMM granularity
// of the GPUs vmmipc targets (2 MiB, measured). The configuration is read
// before any driver is asked; core asks the driver for the granularity it
// carves with (core/arena/export_arena.cc).
inline constexpr uint64_t kLayoutAlignment = 2u << 20;

// What a variable's value must be beyond its kind's syntax: params.def's
// `rule`, the one statement of each variable's range. The parse refuses a
// value that breaks it, in its words (Violation), and vmmipc-config --markdown
// shows it in docs/configuration.md (Describe).
struct Rule {
  enum class Type { kAny, kRange, kMultiple, kChoice, kNotEmpty };
  Type type = Type::kAny;
  int64_t min = 0;               // kRange, inclusive
  int64_t max = 0;               // kRange, inclusive
  uint64_t multiple = 0;         // kMultiple
  bool positive = false;         // kMultiple: 0 is refused too
  const char* choices = "";      // kChoice: the values, blank-separated
  const char* reason = nullptr;  // the refusal's words, where the rule's own would not do
  const char* shown = nullptr;   // the docs' words for what is accepted, likewise
  const char* note = nullptr;    // said after it in the docs
};
constexpr Rule Any(const char* shown = nullptr) { return {.shown = shown}; }
constexpr Rule Between(int64_t min, int64_t max, const char* reason = nullptr,
                       const char* shown = nullptr, const char* note = nullptr) {
  return {.type = Rule::Type::kRange,
          .min = min,
          .max = max,
          .reason = reason,
          .shown = shown,
          .note = note};
}
constexpr Rule MultipleOf(uint64_t multiple) {
  return {.type = Rule::Type::kMultiple, .multiple = multiple};
}
constexpr Rule PositiveMultipleOf(uint64_t multiple) {
  return {.type = Rule::Type::kMultiple, .multiple = multiple, .positive = true};
}
constexpr Rule OneOf(const char* choices) {
  return {.type = Rule::Type::kChoice, .choices = choices};
}
constexpr Rule NotEmpty(const char* shown = nullptr) {
  return {.type = Rule::Type::kNotEmpty, .shown = shown};
}

struct ParamSpec {
  const char* name;
  Kind kind;
  const char* default_text;
  Rule rule;
  const char* doc;  // markdown (docs/configuration.md)
  // Declared with VMMIPC_TEST_PARAM: kept for tests and benchmarks, shown in
  // the docs' second table.
  bool for_tests = false;
};

// Why a value breaks `rule` ("must be between 1 and 64"), or empty when it
// does not. The kinds a rule does not apply to never break it.
std::string Violation(const Rule& rule, int64_t value);
std::string Violation(const Rule& rule, uint64_t value);
std::string Violation(const Rule& rule, const std::string& value);
inline std::string Violation(const Rule&, bool) { return {}; }
inline std::string Violation(const Rule&, log::Level) { return {}; }
// What a variable of `kind` under `rule` accepts, in markdown, for the docs:
// "1 to 64", "a positive multiple of 2 MiB", "`auto`, `env`, `gpu` or `off`"; with
// the spellings of booleans and log levels (from their parsers).
std::string DescribeValues(Kind kind, const Rule& rule);
// Why text that is not a value of `kind` was refused: "not a whole number".
const char* SyntaxError(Kind kind);

// The C++ type of each kind of params.def.
template <Kind>
struct KindType;
template <>
struct KindType<Kind::kBool> {
  using type = bool;
};
template <>
struct KindType<Kind::kInt> {
  using type = int64_t;
};
template <>
struct KindType<Kind::kSize> {
  using type = uint64_t;
};
template <>
struct KindType<Kind::kString> {
  using type = std::string;
};
template <>
struct KindType<Kind::kLogLevel> {
  using type = log::Level;
};

// The number of variables in params.def.
inline constexpr size_t kParamCount = 0
#define VMMIPC_PARAM(field, name, kind, def, rule, doc) +1
#include "config/params.def"
#undef VMMIPC_PARAM
    ;

// Where a variable's value came from, once Parse has settled it.
enum class Origin {
  kDefault,      // not set: the default
  kEnvironment,  // set, and used as set
  kIgnored,      // set but refused (syntax or range): the default; `why` says why
  kLayout,       // changed by the layout check (to its default, or off); `why` says why
  kRankRule,     // VMMIPC_RANK only: the rank came from LOCAL_RANK or RANK (rank_source),
                 // or VMMIPC_RANK_FROM=gpu/off set the variable aside
};

struct Outcome {
  Origin origin = Origin::kDefault;
  std::string why;     // for kIgnored and kLayout: the warning line
  std::string reason;  // for kIgnored: why alone ("not a whole number", "must be between 1 and 64")
};

struct Params {
  // Every field holds its default, parsed from the text params.def gives (the
  // text the docs and the warnings show), so the two cannot disagree.
  Params();

  // One field per variable of params.def, of its kind's type.
#define VMMIPC_PARAM(field, name, kind, def, rule, doc) KindType<Kind::kind>::type field{};
#include "config/params.def"
#undef VMMIPC_PARAM
  // Derived: where the rank came from ("VMMIPC_RANK", "LOCAL_RANK", "RANK" or "none").
  std::string rank_source = "none";
  // What Parse found wrong, one warning line each, in order. Get() logs them
  // once the log knows the rank, so they carry the right tag.
  std::vector<std::string> warnings;
  // The names of the environment that look like ours (VMMIPC_ in any case)
  // but are no variable and no old name: ignored, with a warning each. Sorted.
  std::vector<std::string> unknown;
  // Per variable of AllParams(), in its order: where the value came from.
  std::array<Outcome, kParamCount> outcomes{};
  // The parts of the layout the layout check turned off, for want of room
  // (zone_base 0, zone_fallback_base 0, arena false), as opposed to by choice.
  struct {
    bool zone = false;
    bool fallback = false;
    bool arena = false;
  } turned_off;

  // A process with no rank from a variable may get one slot per GPU it
  // exports from (core/export/rank_slot.h).
  // VMMIPC_TIMEOUT_MS as the one value the socket protocol's waits take.
  Timeout timeout() const { return Timeout::Ms(timeout_ms); }
  bool slot_from_gpu() const { return rank < 0 && (rank_from == "auto" || rank_from == "gpu"); }
  // The export arena serves processes whose slot is known to be wanted: a rank
  // from a variable, or VMMIPC_RANK_FROM=gpu (every process here is a GPU
  // rank). A slot found from the GPU under auto does not turn it on: every
  // CUDA process would get one, and the arena moves all of a process's VMM
  // reservations, also in processes that never export.
  bool arena_wanted() const { return arena && (rank >= 0 || rank_from == "gpu"); }
  // The rank slot of this process's memory on the GPU that is `host_index`
  // among the host's GPUs (driver/host_gpus.h; -1: unknown): its rank from a
  // variable, else that index when slot_from_gpu() and a handle can carry it,
  // else -1 (unranked: peers place the memory best-effort). core/export/rank_slot.cc
  // and the configuration tool decide with it.
  int64_t SlotFor(int host_index) const {
    if (rank >= 0) return rank;
    return slot_from_gpu() && host_index >= 0 && host_index <= kMaxRank ? host_index : -1;
  }
};

// The top of the user address space with 4-level paging on x86-64, where the
// H100/H200 hosts vmmipc targets run: no part of the layout may reach past it.
inline constexpr uint64_t kUserAddressEnd = 0x800000000000ull;

using EnvLookup = std::function<const char*(const char*)>;

std::span<const ParamSpec> AllParams();
// A variable that was renamed: the old name still works, with one warning,
// where the new one is not set (and is ignored, with one, where it is).
struct RenamedParam {
  const char* old_name;
  const char* name;  // the variable's name now (AllParams)
};
std::span<const RenamedParam> RenamedParams();
// The index in AllParams() of the variable `name`; kParamCount when there is none.
size_t ParamIndex(std::string_view name);
// The value of variable `index` of AllParams() as text, as the variable
// would be set: "1", "0x300000000000", "warn", a string as it is (unquoted).
std::string ValueText(const Params& params, size_t index);
// Parses every parameter through `lookup` (getenv in production), then
// settles the address layout: the import zone (VMMIPC_ZONE_SLOTS x
// VMMIPC_SLOT_SIZE) must not overflow, and the zone, the fallback zone and the
// export arena must each end below kUserAddressEnd, not overlap one another,
// and the arena must fit one slot. A part that does not falls back to its
// defaults, or is turned off when they do not fit either (zone_base 0,
// zone_fallback_base 0, arena false), with one warning naming the variables.
// The result always satisfies these bounds. `names` are the names set in the
// environment (EnvironmentNames): each that starts with VMMIPC_, in any case,
// and is no variable and no old name gets one warning, with the variable it
// most likely means (SuggestName), and is listed in `unknown`. Parse logs
// nothing: the warnings are in the result's `warnings`.
Params Parse(const EnvLookup& lookup, const std::vector<std::string>& names = {});
// The names of the process's environment (environ), in its order.
std::vector<std::string> EnvironmentNames();
// The variable an unknown name most likely stands for: the declared name (or
// old name, which gives its name now) at the least edit distance from it, in
// capitals, with a swap of two neighbours one edit, where that distance is
// at most a third of the name after VMMIPC_ (one edit at least); empty when
// none is that near. "VMMIPC_LOGLEVEL" -> "VMMIPC_LOG_LEVEL".
std::string SuggestName(std::string_view name);
// The process's parameters, parsed from the environment on first call (never
// at load time: core reads them at the first hook or dlsym that needs them).
// That call also sets the log's level, rank and file from them, opens the log
// file (log::OpenFile: a bad one is told then, once, on stderr), then logs
// the warnings of Parse, unknown VMMIPC_* names included.
const Params& Get();
// VMMIPC_ENABLE alone, read with getenv: for what runs before the
// configuration is read, at load time (core/load_time.h). Nothing else is
// parsed and nothing is logged; a value that does not parse reads as the
// default, as Parse reads it.
bool EnabledByEnvironment();
// The effective configuration on one line, for the log: every variable whose
// value differs from its default (VMMIPC_RANK aside), then the rank and where
// it came from, e.g. "config: VMMIPC_LOG_LEVEL=info VMMIPC_STATS=1 (others
// default); rank 0 from LOCAL_RANK".
std::string Describe(const Params& params);

}  // namespace vmmipc::config
