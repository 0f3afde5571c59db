// Names in the environment that look like vmmipc's but are none of its
// variables: the likely one (by edit distance, old names too), and the
// warning each gets when the configuration is read.
#include "config/unknown_names.h"

#include <algorithm>
#include <cctype>
#include <string_view>
#include <vector>

extern char** environ;

namespace vmmipc::config {
namespace {

// `text` in capitals.
std::string Upper(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

// The optimal-string-alignment distance: insertions, deletions, substitutions
// and swaps of two neighbours, one edit each ("LOGLEVEL" is one from
// "LOG_LEVEL", "RANK_FORM" one from "RANK_FROM").
size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

constexpr std::string_view kPrefix = "VMMIPC_";

bool LooksLikeOurs(std::string_view name) {
  return name.size() >= kPrefix.size() && Upper(name.substr(0, kPrefix.size())) == kPrefix;
}

bool IsOldName(std::string_view name) {
  for (const RenamedParam& renamed : RenamedParams())
    if (name == renamed.old_name) return true;
  return false;
}

// The warning of an unknown name that looks like ours.
std::string UnknownNameWarning(const std::string& name, const char* text) {
  const std::string suggestion = SuggestName(name);
  std::string hint = " (docs/configuration.md lists them)";
  if (!suggestion.empty()) {
    hint = fmt::format("; did you mean {}?", suggestion);
    for (const RenamedParam& renamed : RenamedParams())
      if (suggestion == renamed.name &&
          EditDistance(Upper(name), renamed.old_name) < EditDistance(Upper(name), renamed.name))
        hint = fmt::format("; did you mean {} (once {})?", renamed.name, renamed.old_name);
  }
  return fmt::format("ignoring {}='{}': not a vmmipc variable{}", name, text != nullptr ? text : "",
                     hint);
}

}  // namespace

// The names of `names` that look like ours but are not: a warning each.
void ParseUnknownNames(const EnvLookup& lookup, const std::vector<std::string>& names,
                       Params* params) {
  for (const std::string& name : names)
    if (LooksLikeOurs(name) && ParamIndex(name) == kParamCount && !IsOldName(name))
      params->unknown.push_back(name);
  std::sort(params->unknown.begin(), params->unknown.end());
  params->unknown.erase(std::unique(params->unknown.begin(), params->unknown.end()),
                        params->unknown.end());
  for (const std::string& name : params->unknown)
    params->warnings.push_back(UnknownNameWarning(name, lookup(name.c_str())));
}

std::string SuggestName(std::string_view name) {
  if (!LooksLikeOurs(name)) return "";
  const std::string wanted = Upper(name.substr(kPrefix.size()));
  std::string best;
  size_t best_distance = ~size_t{0};
  auto consider = [&](std::string_view candidate, std::string_view suggestion) {
    const std::string_view tail = candidate.substr(kPrefix.size());
    const size_t distance = EditDistance(wanted, tail);
    const size_t bound = std::max<size_t>(1, std::max(tail.size(), wanted.size()) / 3);
    if (distance <= bound && distance < best_distance) {
      best = suggestion;
      best_distance = distance;
    }
  };
  for (const ParamSpec& spec : AllParams()) consider(spec.name, spec.name);
  for (const RenamedParam& renamed : RenamedParams()) consider(renamed.old_name, renamed.name);
  return best;
}

std::vector<std::string> EnvironmentNames() {
  std::vector<std::string> names;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    names.emplace_back(text.substr(0, text.find('=')));
  }
  return names;
}

}  // namespace vmmipc::config
