// Parsing of the parameter table in params.def: the defaults, the values of
// the environment with their range checks, the rank and its fallbacks, and
// the summary of the effective configuration that a process logs once. The
// layout the values form together is checked in layout.cc.
#include "config/params.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>
#include <type_traits>

#include "config/cross_settings.h"
#include "config/layout.h"
#include "config/unknown_names.h"

namespace vmmipc::config {
namespace {

constexpr ParamSpec kSpecs[] = {
#define VMMIPC_PARAM(field, name, kind, def, rule, doc) {name, Kind::kind, def, rule, doc},
#define VMMIPC_TEST_PARAM(field, name, kind, def, rule, doc) \
  {name, Kind::kind, def, rule, doc, true},
#include "config/params.def"
#undef VMMIPC_TEST_PARAM
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

// The rule's choices, one by one.
std::vector<std::string> Choices(const Rule& rule) {
  std::vector<std::string> out;
  std::string_view rest(rule.choices);
  while (!rest.empty()) {
    const size_t blank = rest.find(' ');
    if (blank != 0) out.emplace_back(rest.substr(0, blank));
    if (blank == std::string_view::npos) break;
    rest.remove_prefix(blank + 1);
  }
  return out;
}

// "a, b or c", each item wrapped in `quote`.
std::string Listed(const std::vector<std::string>& items, const char* quote = "") {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += i + 1 == items.size() ? " or " : ", ";
    out += fmt::format("{}{}{}", quote, items[i], quote);
  }
  return out;
}

// Old names, newest rename last. VMMIPC_PREFETCH took levels 0-3; only 3
// (map ahead) lives on, as VMMIPC_AHEAD=1 (RetiredPrefetch).
constexpr RenamedParam kRenamed[] = {
    {"VMMIPC_EXPORT_ANCHOR", "VMMIPC_EXPORT_KEEPALIVE"},
    {"VMMIPC_PREFETCH", "VMMIPC_AHEAD"},
};

// VMMIPC_PREFETCH's text as VMMIPC_AHEAD's: 3 was map ahead, now AHEAD=1;
// 1 and 2 were removed (the text given becomes "0", said in a warning).
const char* RetiredPrefetch(const char* old_text, Params* params) {
  if (Trim(old_text) == "3") return "1";
  if (Trim(old_text) != "0")
    params->warnings.push_back(fmt::format(
        "VMMIPC_PREFETCH={}: prefetch levels 1 and 2 were removed; nothing is prefetched (map "
        "ahead, once level 3, is VMMIPC_AHEAD=1)",
        old_text));
  return "0";
}

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
    if (strcmp(renamed.old_name, "VMMIPC_PREFETCH") == 0) return RetiredPrefetch(old_text, params);
    return old_text;
  }
  return text;
}

// The warning of a refused value, and what is used instead. VMMIPC_RANK's
// default (-1) is no value but its absence: LOCAL_RANK, RANK and the GPU are
// still asked (SettleRank), so "the default -1" would say less than happens.
std::string Refusal(const char* name, const char* text, const std::string& why, const char* def) {
  if (!strcmp(name, "VMMIPC_RANK"))
    return fmt::format("ignoring {}='{}': {}; treated as unset (LOCAL_RANK, RANK, then the GPU)",
                       name, text, why);
  return fmt::format("ignoring {}='{}': {}; using the default {}", name, text, why, def);
}

// Every variable of params.def from `lookup`: a bad value (its kind's syntax,
// then its rule) is reported and the default kept.
void ParseVariables(const EnvLookup& lookup, Params* params) {
  size_t index = 0;
#define VMMIPC_PARAM(field, name, kind, def, rule, doc)                              \
  if (const char* text = LookUpWithOldName(lookup, name, params); text != nullptr) { \
    auto saved = params->field;                                                      \
    const std::string why = Assign(&params->field, Kind::kind, text)                 \
                                ? Violation(rule, params->field)                     \
                                : SyntaxError(Kind::kind);                           \
    Outcome& outcome = params->outcomes[index];                                      \
    if (!why.empty()) {                                                              \
      params->field = saved;                                                         \
      outcome.origin = Origin::kIgnored;                                             \
      outcome.reason = why;                                                          \
      outcome.why = Refusal(name, text, why, def);                                   \
      params->warnings.push_back(outcome.why);                                       \
    } else {                                                                         \
      outcome.origin = Origin::kEnvironment;                                         \
      if (!strcmp(name, "VMMIPC_RANK")) params->rank_source = "VMMIPC_RANK";         \
    }                                                                                \
  }                                                                                  \
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
#define VMMIPC_PARAM(field, name, kind, def, rule, doc) Assign(&field, Kind::kind, def);
#include "config/params.def"
#undef VMMIPC_PARAM
}

std::string Violation(const Rule& rule, int64_t value) {
  if (rule.type != Rule::Type::kRange || (value >= rule.min && value <= rule.max)) return {};
  return rule.reason != nullptr ? rule.reason
                                : fmt::format("must be between {} and {}", rule.min, rule.max);
}

std::string Violation(const Rule& rule, uint64_t value) {
  if (rule.type != Rule::Type::kMultiple) return {};
  if (value % rule.multiple == 0 && (value != 0 || !rule.positive)) return {};
  if (rule.reason != nullptr) return rule.reason;
  return fmt::format("must be a {}multiple of {}", rule.positive ? "positive " : "",
                     log::Bytes(rule.multiple));
}

std::string Violation(const Rule& rule, const std::string& value) {
  if (rule.type == Rule::Type::kNotEmpty && value.empty())
    return rule.reason != nullptr ? rule.reason : "must not be empty";
  if (rule.type != Rule::Type::kChoice) return {};
  const std::vector<std::string> choices = Choices(rule);
  if (std::find(choices.begin(), choices.end(), value) != choices.end()) return {};
  return rule.reason != nullptr ? rule.reason : "must be " + Listed(choices);
}

const char* SyntaxError(Kind kind) {
  switch (kind) {
    case Kind::kBool:
      return "not a boolean (1, true, yes or on; 0, false, no or off)";
    case Kind::kInt:
      return "not a whole number";
    case Kind::kSize:
      return "not a size (decimal or 0x hex, with an optional K, M, G or T)";
    case Kind::kString:
      return "not text";
    case Kind::kLogLevel:
      return "not a log level (trace, debug, info, warn, error or off)";
  }
  return "cannot be parsed";
}

std::string DescribeValues(Kind kind, const Rule& rule) {
  std::string what;
  if (rule.shown != nullptr) {
    what = rule.shown;
  } else {
    switch (rule.type) {
      case Rule::Type::kAny:
        break;
      case Rule::Type::kRange:
        what = fmt::format("{} to {}", rule.min, rule.max);
        break;
      case Rule::Type::kMultiple:
        what = fmt::format("a {}multiple of {}", rule.positive ? "positive " : "",
                           log::Bytes(rule.multiple));
        break;
      case Rule::Type::kChoice:
        what = Listed(Choices(rule), "`");
        break;
      case Rule::Type::kNotEmpty:
        what = "not empty";
        break;
    }
  }
  if (rule.note != nullptr) what += fmt::format(" ({})", rule.note);
  auto spelt = [](auto words) {
    std::vector<std::string> quoted;
    for (const auto& word : words) quoted.push_back(fmt::format("`{}`", word));
    return quoted;
  };
  switch (kind) {
    case Kind::kBool:
      return fmt::format("{}; {} (any case)", Listed(spelt(kTrueWords)),
                         Listed(spelt(kFalseWords)));
    case Kind::kLogLevel: {
      std::vector<std::string> names;
      for (const log::LevelSpelling& spelling : log::LevelSpellings()) {
        if (spelling.name == std::string_view(log::LevelName(spelling.level)))
          names.push_back(fmt::format("`{}`", spelling.name));
        else
          names.back() += fmt::format(" (`{}`)", spelling.name);
      }
      return Listed(names) + " (any case)";
    }
    case Kind::kInt:
      return what.empty() ? "a whole number" : what;
    case Kind::kSize:
      return (what.empty() ? "any size" : what) + " (a size)";
    case Kind::kString:
      return what.empty() ? "any text" : what;
  }
  return what;
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
#define VMMIPC_PARAM(field, name, kind, def, rule, doc) \
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
#define VMMIPC_PARAM(field, variable, kind, def, rule, doc) \
  if constexpr (std::string_view(#field) == "enable") {     \
    name = variable;                                        \
    default_text = def;                                     \
  }
#include "config/params.def"
#undef VMMIPC_PARAM
  bool enabled = true;
  ParseBool(default_text, &enabled);
  if (const char* text = std::getenv(name)) ParseBool(text, &enabled);
  return enabled;
}

Params Parse(const EnvLookup& lookup, const std::vector<std::string>& names) {
  // Defaults first, from the same table text that the docs show; then the
  // environment. Each value is fine on its own; together they must still
  // form a layout. Then the rank, from its variables; then the names that
  // are none of ours; last, what the settings do together.
  Params params;
  ParseVariables(lookup, &params);
  SettleLayout(&params);
  SettleRank(lookup, &params);
  ParseUnknownNames(lookup, names, &params);
  AddCrossSettingWarnings(&params);
  return params;
}

const Params& Get() {
  static Params* params = nullptr;  // never destroyed: hooks may run during exit
  static std::once_flag once;
  std::call_once(once, [] {
    params = new Params(Parse([](const char* n) { return std::getenv(n); }, EnvironmentNames()));
    // The log learns everything it needs before the first warning, so that
    // line already carries the rank and goes where VMMIPC_LOG_FILE says. The
    // file is opened now, not by the first line: a name that cannot be used
    // is told now (one line on stderr), not after something else went wrong.
    // Never at load time: this is the first hook's (or dlsym's) call.
    log::SetLevel(params->log_level);
    log::SetRank(static_cast<int>(params->rank));
    log::SetFile(params->log_file);
    log::OpenFile();
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
#define VMMIPC_PARAM(field, name, kind, def, rule, doc)                   \
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
