// The configuration of vmmipc: every VMMIPC_* variable is declared once in
// params.def (name, kind, default, doc), from which the fields of Params and
// their defaults are generated; parsed once, and read through Get().
// Invalid values are warned about and ignored (the default stays); so is an
// address layout (import zone, fallback zone, export arena) that does not fit.
// Also the one-line summary of the effective configuration (Describe).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "common/log.h"

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

  // A process with no rank from a variable may get one slot per GPU it
  // exports from (core/rank_slot.h).
  bool slot_from_gpu() const { return rank < 0 && (rank_from == "auto" || rank_from == "gpu"); }
  // The export arena serves processes whose slot is known to be wanted: a rank
  // from a variable, or VMMIPC_RANK_FROM=gpu (every process here is a GPU
  // rank). A slot found from the GPU under auto does not turn it on: every
  // CUDA process would get one, and the arena moves all of a process's VMM
  // reservations, also in processes that never export.
  bool arena_wanted() const { return arena && (rank >= 0 || rank_from == "gpu"); }
};

// The top of the user address space with 4-level paging on x86-64, where the
// H100/H200 hosts vmmipc targets run: no part of the layout may reach past it.
inline constexpr uint64_t kUserAddressEnd = 0x800000000000ull;

using EnvLookup = std::function<const char*(const char*)>;

std::span<const ParamSpec> AllParams();
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

// Value parsers, exposed for tests. They accept surrounding whitespace.
bool ParseBool(const char* text, bool* out);
bool ParseInt(const char* text, int64_t* out);
bool ParseSize(const char* text, uint64_t* out);

}  // namespace vmmipc::config
