// Parsing of the parameter table in params.def: the defaults, the values of
// the environment with their range checks, the rank and its fallbacks, and
// the summary of the effective configuration that a process logs once. The
// layout the values form together is checked in layout.cc.
#include "config/params.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>
#include <type_traits>

#include "config/layout.h"

namespace vmmipc::config {
namespace {

constexpr ParamSpec kSpecs[] = {
#define VMMIPC_PARAM(field, name, kind, def, doc) {name, Kind::kind, def, doc},
#include "config/params.def"
#undef VMMIPC_PARAM
};
static_assert(std::size(kSpecs) == kParamCount);

bool Assign(bool* field, Kind, const char* text) { return ParseBool(text, field); }
bool Assign(int64_t* field, Kind, const char* text) { return ParseInt(text, field); }
bool Assign(uint64_t* field, Kind, const char* text) { return ParseSize(text, field); }
bool Assign(std::string* field, Kind, const char* text) {
  *field = Trim(text);
  return true;
}
bool Assign(log::Level* field, Kind, const char* text) {
  return log::ParseLevel(Trim(text), field);
}

// A value as the configuration line shows it: as the variable would be set.
std::string Show(bool value) { return value ? "1" : "0"; }
std::string Show(int64_t value) { return std::to_string(value); }
std::string Show(uint64_t value) { return fmt::format("0x{:x}", value); }
std::string Show(log::Level value) { return log::LevelName(value); }
std::string Show(const std::string& value) {
  if (!value.empty() && value.find_first_of(" \t'\"") == std::string::npos) return value;
  return fmt::format("'{}'", value);  // empty, or with blanks: quoted, so the line still splits
}
// The same without the quotes: a value on its own.
template <typename T>
std::string Plain(const T& value) {
  return Show(value);
}
std::string Plain(const std::string& value) { return value; }

// What the layout's bases and sizes must be multiples of: the VMM granularity
// of the GPUs vmmipc targets (2 MiB, measured). The configuration is read
// before any driver is asked; core asks the driver for the granularity it
// carves with (core/arena/export_arena.cc).
constexpr uint64_t kLayoutAlignment = 2u << 20;

// Values checked beyond their syntax; returns a reason, or nullptr when fine.
const char* Invalid(const Params& p, const char* name) {
  if (!strcmp(name, "VMMIPC_ZONE_SLOTS") && (p.zone_slots < 1 || p.zone_slots > kMaxRank))
    return "must be between 1 and 65534";
  if (!strcmp(name, "VMMIPC_SLOT_SIZE") &&
      (p.slot_size == 0 || p.slot_size % kLayoutAlignment != 0))
    return "must be a positive multiple of 2 MiB";
  if ((!strcmp(name, "VMMIPC_ZONE_BASE") || !strcmp(name, "VMMIPC_ZONE_FALLBACK_BASE")) &&
      (p.zone_base % kLayoutAlignment != 0 || p.zone_fallback_base % kLayoutAlignment != 0))
    return "must be a multiple of 2 MiB";
  if (!strcmp(name, "VMMIPC_TIMEOUT_MS") && (p.timeout_ms < 1 || p.timeout_ms > 3600000))
    return "must be between 1 and 3600000";
  if (!strcmp(name, "VMMIPC_RANK") && (p.rank < -1 || p.rank > kMaxRank))
    return "must be between 0 and 65534 (or -1 for unranked)";
  if (!strcmp(name, "VMMIPC_RANK_FROM") && p.rank_from != "auto" && p.rank_from != "env" &&
      p.rank_from != "gpu" && p.rank_from != "off")
    return "must be auto, env, gpu or off";
  if (!strcmp(name, "VMMIPC_ARENA_BASE") && p.arena_base % kLayoutAlignment != 0)
    return "must be a multiple of 2 MiB";
  if (!strcmp(name, "VMMIPC_ARENA_SIZE") &&
      (p.arena_size == 0 || p.arena_size % kLayoutAlignment != 0))
    return "must be a positive multiple of 2 MiB";
  if (!strcmp(name, "VMMIPC_CUDA_LIBRARY") && p.cuda_library.empty()) return "must not be empty";
  if (!strcmp(name, "VMMIPC_EXPORT_FD_CACHE") &&
      (p.export_fd_cache < 1 || p.export_fd_cache > 1000000))
    return "must be between 1 and 1000000";
  if (!strcmp(name, "VMMIPC_LISTENER_THREADS") &&
      (p.listener_threads < 1 || p.listener_threads > 64))
    return "must be between 1 and 64";
  return nullptr;
}

// Old names, newest rename last.
constexpr RenamedParam kRenamed[] = {
    {"VMMIPC_EXPORT_ANCHOR", "VMMIPC_EXPORT_KEEPALIVE"},
};

// `lookup` that answers a variable's old name too, with one warning.
const char* LookUpWithOldName(const EnvLookup& lookup, const char* name, Params* params) {
  const char* text = lookup(name);
  for (const RenamedParam& renamed : kRenamed) {
    if (strcmp(renamed.name, name) != 0) continue;
    const char* old_text = lookup(renamed.old_name);
    if (old_text == nullptr) return text;
    if (text != nullptr) {
      params->warnings.push_back(
          fmt::format("ignoring {}='{}': it is the old name of {}, which is set", renamed.old_name,
                      old_text, name));
      return text;
    }
    params->warnings.push_back(
        fmt::format("{} is the old name of {}: it still works, but will go; set {} instead",
                    renamed.old_name, name, name));
    return old_text;
  }
  return text;
}

// Every variable of params.def from `lookup`: a bad value is reported and the
// default kept.
void ParseVariables(const EnvLookup& lookup, Params* params) {
  size_t index = 0;
#define VMMIPC_PARAM(field, name, kind, def, doc)                                               \
  if (const char* text = LookUpWithOldName(lookup, name, params); text != nullptr) {            \
    auto saved = params->field;                                                                 \
    const char* why =                                                                           \
        Assign(&params->field, Kind::kind, text) ? Invalid(*params, name) : "cannot be parsed"; \
    Outcome& outcome = params->outcomes[index];                                                 \
    if (why != nullptr) {                                                                       \
      params->field = saved;                                                                    \
      outcome.origin = Origin::kIgnored;                                                        \
      outcome.why =                                                                             \
          fmt::format("ignoring {}='{}': {}; using the default {}", name, text, why, def);      \
      params->warnings.push_back(outcome.why);                                                  \
    } else {                                                                                    \
      outcome.origin = Origin::kEnvironment;                                                    \
      if (!strcmp(name, "VMMIPC_RANK")) params->rank_source = "VMMIPC_RANK";                    \
    }                                                                                           \
  }                                                                                             \
  ++index;
#include "config/params.def"
#undef VMMIPC_PARAM
}

// The rank's sources once VMMIPC_RANK is parsed: VMMIPC_RANK_FROM gpu and off
// ignore every rank variable; else, without VMMIPC_RANK, LOCAL_RANK then RANK
// (IPC stays within one node, so the local rank is the right slot).
void SettleRank(const EnvLookup& lookup, Params* params) {
  Outcome& outcome = params->outcomes[ParamIndex("VMMIPC_RANK")];
  if (params->rank_from == "gpu" || params->rank_from == "off") {
    if (outcome.origin == Origin::kEnvironment) outcome.origin = Origin::kRankRule;
    params->rank = -1;
    params->rank_source = "none";
    return;
  }
  if (params->rank_source != "none" && params->rank >= 0) return;
  params->rank_source = "none";
  params->rank = -1;
  for (const char* name : {"LOCAL_RANK", "RANK"}) {
    const char* text = lookup(name);
    if (text == nullptr) continue;
    int64_t value = -1;
    if (ParseInt(text, &value) && value >= 0 && value <= kMaxRank) {
      params->rank = value;
      params->rank_source = name;
      outcome.origin = Origin::kRankRule;
      return;
    }
    params->warnings.push_back(
        fmt::format("ignoring {}='{}': not a rank between 0 and 65534", name, text));
  }
}

}  // namespace

// A default that did not parse would leave the field value-initialized;
// tests/unit/params_test.cc parses every default as a value, so none fails.
Params::Params() {
#define VMMIPC_PARAM(field, name, kind, def, doc) Assign(&field, Kind::kind, def);
#include "config/params.def"
#undef VMMIPC_PARAM
}

std::span<const ParamSpec> AllParams() { return kSpecs; }

std::span<const RenamedParam> RenamedParams() { return kRenamed; }

size_t ParamIndex(std::string_view name) {
  for (size_t i = 0; i < kParamCount; ++i)
    if (name == kSpecs[i].name) return i;
  return kParamCount;
}

std::string ValueText(const Params& params, size_t index) {
  size_t at = 0;
#define VMMIPC_PARAM(field, name, kind, def, doc) \
  if (at++ == index) return Plain(params.field);
#include "config/params.def"
#undef VMMIPC_PARAM
  return "";
}

bool EnabledByEnvironment() {
  // The variable of the `enable` field, and its default, as params.def names them.
  static_assert(std::is_same_v<decltype(Params::enable), bool>);
  const char* name = "";
  const char* default_text = "1";
#define VMMIPC_PARAM(field, variable, kind, def, doc)   \
  if constexpr (std::string_view(#field) == "enable") { \
    name = variable;                                    \
    default_text = def;                                 \
  }
#include "config/params.def"
#undef VMMIPC_PARAM
  bool enabled = true;
  ParseBool(default_text, &enabled);
  if (const char* text = std::getenv(name)) ParseBool(text, &enabled);
  return enabled;
}

Params Parse(const EnvLookup& lookup) {
  // Defaults first, from the same table text that the docs show; then the
  // environment. Each value is fine on its own; together they must still
  // form a layout. Then the rank, from its variables.
  Params params;
  ParseVariables(lookup, &params);
  SettleLayout(&params);
  SettleRank(lookup, &params);
  return params;
}

const Params& Get() {
  static Params* params = nullptr;  // never destroyed: hooks may run during exit
  static std::once_flag once;
  std::call_once(once, [] {
    params = new Params(Parse([](const char* n) { return std::getenv(n); }));
    // The log learns everything it needs before the first warning, so that
    // line already carries the rank and goes where VMMIPC_LOG_FILE says.
    log::SetLevel(params->log_level);
    log::SetRank(static_cast<int>(params->rank));
    log::SetFile(params->log_file);
    for (const std::string& warning : params->warnings) VMMIPC_LOG_WARN("{}", warning);
  });
  return *params;
}

std::string Describe(const Params& params) {
  const Params defaults;
  std::string changed;
  auto add = [&](const char* name, const std::string& value) {
    if (!changed.empty()) changed += ' ';
    changed += fmt::format("{}={}", name, value);
  };
  // The rank has its own part below (it may come from LOCAL_RANK or RANK).
#define VMMIPC_PARAM(field, name, kind, def, doc)                         \
  if (params.field != defaults.field && strcmp(name, "VMMIPC_RANK") != 0) \
    add(name, Show(params.field));
#include "config/params.def"
#undef VMMIPC_PARAM
  std::string rank;
  if (params.rank >= 0)
    rank = fmt::format("rank {} from {}", params.rank, params.rank_source);
  else if (params.slot_from_gpu())
    rank = params.rank_from == "gpu"
               ? "rank slot from the GPU on first export (VMMIPC_RANK_FROM=gpu)"
               : "rank slot from the GPU on first export (no rank variable)";
  else
    rank = params.rank_from == "off" ? "unranked (VMMIPC_RANK_FROM=off)"
                                     : "unranked (no rank variable)";
  return fmt::format("config: {}; {}",
                     changed.empty() ? std::string("all defaults") : changed + " (others default)",
                     rank);
}

}  // namespace vmmipc::config
