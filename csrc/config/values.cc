// Parsers of the values of params.def's kinds: 1/true/yes/on, decimal
// integers, and sizes that a user writes as "1T", "512GiB" or "0x300000000000".
#include "config/values.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>

namespace vmmipc::config {
namespace {

// The bits a K/M/G/T suffix shifts by; 0 for any other character.
unsigned SuffixShift(char suffix) {
  switch (std::toupper(static_cast<unsigned char>(suffix))) {
    case 'K':
      return 10;
    case 'M':
      return 20;
    case 'G':
      return 30;
    case 'T':
      return 40;
    default:
      return 0;
  }
}

}  // namespace

std::string Trim(const char* text) {
  std::string s(text);
  size_t begin = s.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  size_t end = s.find_last_not_of(" \t\r\n");
  return s.substr(begin, end - begin + 1);
}

bool ParseBool(const char* text, bool* out) {
  std::string s = Trim(text);
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* word : kTrueWords)
    if (s == word) {
      *out = true;
      return true;
    }
  for (const char* word : kFalseWords)
    if (s == word) {
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
    shift = SuffixShift(*end);
    if (shift == 0) return false;
    ++end;
    if (*end == 'i' || *end == 'I') ++end;  // accept "GiB"-style spellings
    if (*end == 'b' || *end == 'B') ++end;
    if (*end != '\0') return false;
  }
  if (shift != 0 && value > (~0ull >> shift)) return false;
  *out = value << shift;
  return true;
}

}  // namespace vmmipc::config
