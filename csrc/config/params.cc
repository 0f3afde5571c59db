// Parsing of the parameter table in params.def, the one check of the address
// layout the values form together (zones and arena), and the summary of the
// effective configuration that a process logs once.
#include "config/params.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <string_view>
#include <type_traits>
#include <utility>

namespace vmmipc::config {
namespace {

constexpr ParamSpec kSpecs[] = {
#define VMMIPC_PARAM(field, name, kind, def, doc) {name, Kind::kind, def, doc},
#include "config/params.def"
#undef VMMIPC_PARAM
};

std::string Trim(const char* text) {
  std::string s(text);
  size_t begin = s.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  size_t end = s.find_last_not_of(" \t\r\n");
  return s.substr(begin, end - begin + 1);
}

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

// What the layout's bases and sizes must be multiples of: the VMM granularity
// of the GPUs vmmipc targets (2 MiB, measured). The configuration is read
// before any driver is asked; core asks the driver for the granularity it
// carves with (core/export_arena.cc).
constexpr uint64_t kLayoutAlignment = 2u << 20;

// Values checked beyond their syntax; returns a reason, or nullptr when fine.
const char* Invalid(const Params& p, const char* name) {
  if (!strcmp(name, "VMMIPC_ZONE_SLOTS") && (p.zone_slots < 1 || p.zone_slots > 0xFFFE))
    return "must be between 1 and 65534";
  if (!strcmp(name, "VMMIPC_SLOT_SIZE") &&
      (p.slot_size == 0 || p.slot_size % kLayoutAlignment != 0))
    return "must be a positive multiple of 2 MiB";
  if ((!strcmp(name, "VMMIPC_ZONE_BASE") || !strcmp(name, "VMMIPC_ZONE_FALLBACK_BASE")) &&
      (p.zone_base % kLayoutAlignment != 0 || p.zone_fallback_base % kLayoutAlignment != 0))
    return "must be a multiple of 2 MiB";
  if (!strcmp(name, "VMMIPC_TIMEOUT_MS") && (p.timeout_ms < 1 || p.timeout_ms > 3600000))
    return "must be between 1 and 3600000";
  if (!strcmp(name, "VMMIPC_RANK") && (p.rank < -1 || p.rank > 0xFFFE))
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

Params Defaults() { return Params(); }

// For ranges already known to end below kUserAddressEnd (no wrap-around).
bool Overlaps(uint64_t a, uint64_t a_size, uint64_t b, uint64_t b_size) {
  return a < b + b_size && b < a + a_size;
}

std::string Span(const char* what, uint64_t base, uint64_t size) {
  return fmt::format("the {} [0x{:x}, +{})", what, base, log::Bytes(size));
}

// Why [base, base + size) cannot be reserved: it wraps around or ends past
// the top of the user address space. Empty when it fits.
std::string PastTheTop(const char* what, uint64_t base, uint64_t size) {
  if (size <= kUserAddressEnd && base <= kUserAddressEnd - size) return "";
  return fmt::format("{} ends past 0x{:x}, the top of the 47-bit user address space",
                     Span(what, base, size), kUserAddressEnd);
}

// One part of the layout: `problem` says why it does not fit (empty when it
// does). Such a part falls back to its defaults; when they do not fit either
// (or it already had them), it is turned off. One warning line either way.
struct LayoutPart {
  std::string values;       // "VMMIPC_X=0x..." as parsed, for the warning
  bool at_default = false;  // the values are the defaults already
  std::function<std::string()> problem;
  std::string default_text;
  std::function<void()> use_default;
  std::function<void()> turn_off;
  const char* off_text = "";
};

void Settle(const LayoutPart& part, std::vector<std::string>* warnings) {
  const std::string why = part.problem();
  if (why.empty()) return;
  if (part.at_default) {
    warnings->push_back(fmt::format("{} (the default): {}; {}", part.values, why, part.off_text));
    part.turn_off();
    return;
  }
  part.use_default();
  const std::string why_default = part.problem();
  if (why_default.empty()) {
    warnings->push_back(
        fmt::format("ignoring {}: {}; using the default {}", part.values, why, part.default_text));
    return;
  }
  warnings->push_back(fmt::format("ignoring {}: {}; the default {} does not fit either ({}); {}",
                                  part.values, why, part.default_text, why_default, part.off_text));
  part.turn_off();
}

// Zone geometry first, then the import zone, the fallback zone (which must
// not overlap the zone) and the arena (which must fit a slot and overlap
// neither zone): each part is checked against the ones already settled.
void SettleLayout(Params* p) {
  const Params d = Defaults();
  uint64_t zone_size = 0;
  const bool wraps =
      __builtin_mul_overflow(static_cast<uint64_t>(p->zone_slots), p->slot_size, &zone_size);
  if (wraps || zone_size > kUserAddressEnd) {
    p->warnings.push_back(fmt::format(
        "ignoring VMMIPC_ZONE_SLOTS={} and VMMIPC_SLOT_SIZE=0x{:x}: the import zone (slots x slot "
        "size) {}; using the defaults {} x 0x{:x}",
        p->zone_slots, p->slot_size,
        wraps
            ? std::string("overflows 64 bits")
            : fmt::format("is {}, more than the 47-bit user address space", log::Bytes(zone_size)),
        d.zone_slots, d.slot_size));
    p->zone_slots = d.zone_slots;
    p->slot_size = d.slot_size;
    zone_size = static_cast<uint64_t>(p->zone_slots) * p->slot_size;
  }

  LayoutPart zone;
  zone.values = fmt::format("VMMIPC_ZONE_BASE=0x{:x}", p->zone_base);
  zone.at_default = p->zone_base == d.zone_base;
  zone.problem = [&]() -> std::string {
    return p->zone_base == 0 ? "" : PastTheTop("import zone", p->zone_base, zone_size);
  };
  zone.default_text = fmt::format("0x{:x}", d.zone_base);
  zone.use_default = [&] { p->zone_base = d.zone_base; };
  zone.turn_off = [&] { p->zone_base = 0; };
  zone.off_text =
      "no import zone at VMMIPC_ZONE_BASE (the fallback zone is tried, else peers are placed "
      "best-effort)";
  Settle(zone, &p->warnings);

  LayoutPart fallback;
  fallback.values = fmt::format("VMMIPC_ZONE_FALLBACK_BASE=0x{:x}", p->zone_fallback_base);
  fallback.at_default = p->zone_fallback_base == d.zone_fallback_base;
  fallback.problem = [&]() -> std::string {
    const uint64_t base = p->zone_fallback_base;
    if (base == 0) return "";
    std::string why = PastTheTop("fallback zone", base, zone_size);
    if (why.empty() && p->zone_base != 0 && Overlaps(base, zone_size, p->zone_base, zone_size))
      why = Span("fallback zone", base, zone_size) + " overlaps " +
            Span("import zone", p->zone_base, zone_size);
    return why;
  };
  fallback.default_text = fmt::format("0x{:x}", d.zone_fallback_base);
  fallback.use_default = [&] { p->zone_fallback_base = d.zone_fallback_base; };
  fallback.turn_off = [&] { p->zone_fallback_base = 0; };
  fallback.off_text = "no fallback zone";
  Settle(fallback, &p->warnings);

  if (!p->arena) return;  // off by choice: nothing to check
  LayoutPart arena;
  arena.values = fmt::format("VMMIPC_ARENA_BASE=0x{:x} and VMMIPC_ARENA_SIZE=0x{:x}", p->arena_base,
                             p->arena_size);
  arena.at_default = p->arena_base == d.arena_base && p->arena_size == d.arena_size;
  arena.problem = [&]() -> std::string {
    const uint64_t base = p->arena_base, size = p->arena_size;
    // The region base in handles is the arena base: every carve must mirror
    // into the exporter's one slot in every importer.
    if (size > p->slot_size)
      return fmt::format(
          "the export arena's size {} is larger than VMMIPC_SLOT_SIZE ({}), so it could not "
          "mirror into one importer slot",
          log::Bytes(size), log::Bytes(p->slot_size));
    std::string why = PastTheTop("export arena", base, size);
    if (!why.empty()) return why;
    for (auto [what, other] : {std::pair{"import zone", p->zone_base},
                               std::pair{"fallback zone", p->zone_fallback_base}}) {
      if (other != 0 && Overlaps(base, size, other, zone_size))
        return Span("export arena", base, size) + " overlaps " + Span(what, other, zone_size);
    }
    return "";
  };
  arena.default_text = fmt::format("0x{:x} and 0x{:x}", d.arena_base, d.arena_size);
  arena.use_default = [&] {
    p->arena_base = d.arena_base;
    p->arena_size = d.arena_size;
  };
  arena.turn_off = [&] { p->arena = false; };
  arena.off_text = "export arena off (a ranked process's own addresses may differ between runs)";
  Settle(arena, &p->warnings);
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

bool ParseBool(const char* text, bool* out) {
  std::string s = Trim(text);
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "1" || s == "true" || s == "yes" || s == "on") {
    *out = true;
    return true;
  }
  if (s == "0" || s == "false" || s == "no" || s == "off") {
    *out = false;
    return true;
  }
  return false;
}

bool ParseInt(const char* text, int64_t* out) {
  std::string s = Trim(text);
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  long long value = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end == s.c_str() || *end != '\0') return false;
  *out = value;
  return true;
}

bool ParseSize(const char* text, uint64_t* out) {
  std::string s = Trim(text);
  // Decimal unless "0x": strtoull's base 0 would read a leading zero as octal
  // ("010T" as 8 TiB). Only the digits go to strtoull, which would otherwise
  // also take a sign, blanks or a second "0x".
  int base = 10;
  size_t start = 0;
  if (s.size() > 1 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    base = 16;
    start = 2;
  }
  size_t stop = start;
  while (stop < s.size() && (base == 16 ? std::isxdigit(static_cast<unsigned char>(s[stop]))
                                        : std::isdigit(static_cast<unsigned char>(s[stop]))))
    ++stop;
  if (stop == start) return false;
  const std::string digits = s.substr(start, stop - start);
  errno = 0;
  unsigned long long value = std::strtoull(digits.c_str(), nullptr, base);
  if (errno != 0) return false;
  const char* end = s.c_str() + stop;
  unsigned shift = 0;
  if (*end != '\0') {
    // clang-format off
    switch (std::toupper(static_cast<unsigned char>(*end))) {
      case 'K': shift = 10; break;
      case 'M': shift = 20; break;
      case 'G': shift = 30; break;
      case 'T': shift = 40; break;
      default: return false;
    }
    // clang-format on
    ++end;
    if (*end == 'i' || *end == 'I') ++end;  // accept "GiB"-style spellings
    if (*end == 'b' || *end == 'B') ++end;
    if (*end != '\0') return false;
  }
  if (shift != 0 && value > (~0ull >> shift)) return false;
  *out = value << shift;
  return true;
}

Params Parse(const EnvLookup& lookup) {
  // Defaults first, from the same table text that the docs show.
  Params params = Defaults();
  // Then the environment; a bad value is reported and the default kept.
#define VMMIPC_PARAM(field, name, kind, def, doc)                                             \
  if (const char* text = lookup(name); text != nullptr) {                                     \
    auto saved = params.field;                                                                \
    const char* why =                                                                         \
        Assign(&params.field, Kind::kind, text) ? Invalid(params, name) : "cannot be parsed"; \
    if (why != nullptr) {                                                                     \
      params.field = saved;                                                                   \
      params.warnings.push_back(                                                              \
          fmt::format("ignoring {}='{}': {}; using the default {}", name, text, why, def));   \
    } else if (!strcmp(name, "VMMIPC_RANK")) {                                                \
      params.rank_source = "VMMIPC_RANK";                                                     \
    }                                                                                         \
  }
#include "config/params.def"
#undef VMMIPC_PARAM
  // Each value is fine on its own; together they must still form a layout.
  SettleLayout(&params);
  // The pinned sources first: gpu and off ignore every rank variable.
  if (params.rank_from == "gpu" || params.rank_from == "off") {
    params.rank = -1;
    params.rank_source = "none";
    return params;
  }
  // Rank fallbacks: IPC stays within one node, so the local rank is the right slot.
  if (params.rank_source == "none" || params.rank < 0) {
    params.rank_source = "none";
    params.rank = -1;
    for (const char* name : {"LOCAL_RANK", "RANK"}) {
      const char* text = lookup(name);
      if (text == nullptr) continue;
      int64_t value = -1;
      if (ParseInt(text, &value) && value >= 0 && value <= 0xFFFE) {
        params.rank = value;
        params.rank_source = name;
        break;
      }
      params.warnings.push_back(
          fmt::format("ignoring {}='{}': not a rank between 0 and 65534", name, text));
    }
  }
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
  const Params defaults = Defaults();
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
