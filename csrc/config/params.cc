// Parsing of the parameter table in params.def.
#include "config/params.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <initializer_list>
#include <cstring>
#include <mutex>

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

// Values checked beyond their syntax; returns a reason, or nullptr when fine.
const char* Invalid(const Params& p, const char* name) {
  if (!strcmp(name, "VMMIPC_ZONE_SLOTS") && (p.zone_slots < 1 || p.zone_slots > 0xFFFE))
    return "must be between 1 and 65534";
  if (!strcmp(name, "VMMIPC_SLOT_SIZE") &&
      (p.slot_size == 0 || p.slot_size % (2u << 20) != 0))
    return "must be a positive multiple of 2 MiB";
  if ((!strcmp(name, "VMMIPC_ZONE_BASE") || !strcmp(name, "VMMIPC_ZONE_FALLBACK_BASE")) &&
      (p.zone_base % (2u << 20) != 0 || p.zone_fallback_base % (2u << 20) != 0))
    return "must be a multiple of 2 MiB";
  if (!strcmp(name, "VMMIPC_TIMEOUT_MS") && (p.timeout_ms < 1 || p.timeout_ms > 3600000))
    return "must be between 1 and 3600000";
  if (!strcmp(name, "VMMIPC_RANK") && (p.rank < -1 || p.rank > 0xFFFE))
    return "must be between 0 and 65534 (or -1 for unranked)";
  if (!strcmp(name, "VMMIPC_ARENA_BASE") && p.arena_base % (2u << 20) != 0)
    return "must be a multiple of 2 MiB";
  if (!strcmp(name, "VMMIPC_ARENA_SIZE") && (p.arena_size == 0 || p.arena_size % (2u << 20) != 0))
    return "must be a positive multiple of 2 MiB";
  if (!strcmp(name, "VMMIPC_CUDA_LIBRARY") && p.cuda_library.empty()) return "must not be empty";
  return nullptr;
}

}  // namespace

std::span<const ParamSpec> AllParams() { return kSpecs; }

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
    switch (std::toupper(static_cast<unsigned char>(*end))) {
      case 'K': shift = 10; break;
      case 'M': shift = 20; break;
      case 'G': shift = 30; break;
      case 'T': shift = 40; break;
      default: return false;
    }
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
  Params params;
  // Defaults first, from the same table text that the docs show.
#define VMMIPC_PARAM(field, name, kind, def, doc) Assign(&params.field, Kind::kind, def);
#include "config/params.def"
#undef VMMIPC_PARAM
  // Then the environment; a bad value is reported and the default kept.
#define VMMIPC_PARAM(field, name, kind, def, doc)                                            \
  if (const char* text = lookup(name); text != nullptr) {                                    \
    auto saved = params.field;                                                               \
    const char* why = Assign(&params.field, Kind::kind, text) ? Invalid(params, name)        \
                                                              : "cannot be parsed";          \
    if (why != nullptr) {                                                                    \
      params.field = saved;                                                                  \
      VMMIPC_LOG_WARN("ignoring {}='{}': {}; using the default {}", name, text, why, def);   \
    } else if (!strcmp(name, "VMMIPC_RANK")) {                                               \
      params.rank_source = "VMMIPC_RANK";                                                    \
    }                                                                                        \
  }
#include "config/params.def"
#undef VMMIPC_PARAM
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
      VMMIPC_LOG_WARN("ignoring {}='{}': not a rank between 0 and 65534", name, text);
    }
  }
  return params;
}

const Params& Get() {
  static Params* params = nullptr;  // never destroyed: hooks may run during exit
  static std::once_flag once;
  std::call_once(once, [] { params = new Params(Parse([](const char* n) { return std::getenv(n); })); });
  return *params;
}

}  // namespace vmmipc::config
