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
#include "config/values.h"

namespace vmmipc::config {

enum class Kind { kBool, kInt, kSize, kString, kLogLevel };

struct ParamSpec {
  const char* name;
  Kind kind;
  const char* default_text;
  const char* doc;
};

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
#define VMMIPC_PARAM(field, name, kind, def, doc) +1
#include "config/params.def"
#undef VMMIPC_PARAM
    ;

// The highest rank slot: a handle carries the slot in 16 bits, and 0xFFFF
// means unranked (state::kUnranked).
inline constexpr int64_t kMaxRank = 0xFFFE;

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
  std::string why;  // for kIgnored and kLayout: the warning line
};

struct Params {
  // Every field holds its default, parsed from the text params.def gives (the
  // text the docs and the warnings show), so the two cannot disagree.
  Params();

  // One field per variable of params.def, of its kind's type.
#define VMMIPC_PARAM(field, name, kind, def, doc) KindType<Kind::kind>::type field{};
#include "config/params.def"
#undef VMMIPC_PARAM
  // Derived: where the rank came from ("VMMIPC_RANK", "LOCAL_RANK", "RANK" or "none").
  std::string rank_source = "none";
  // What Parse found wrong, one warning line each, in order. Get() logs them
  // once the log knows the rank, so they carry the right tag.
  std::vector<std::string> warnings;
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
// The result always satisfies these bounds. Parse logs nothing: the warnings
// are in the result's `warnings`.
Params Parse(const EnvLookup& lookup);
// The process's parameters, parsed from the environment on first call. That
// call also sets the log's level, rank and file from them, then logs the
// warnings of Parse.
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
