// The value syntax of params.def's kinds: booleans, decimal integers and
// sizes (decimal or 0x hex, optional K/M/G/T suffix), each accepting
// surrounding whitespace. Shared by the parse of the environment and the
// defaults' text, so that both read a value the same way.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace vmmipc::config {

// What ParseBool reads as true and as false (in any case); the docs list the same.
inline constexpr std::array<const char*, 4> kTrueWords = {"1", "true", "yes", "on"};
inline constexpr std::array<const char*, 4> kFalseWords = {"0", "false", "no", "off"};

// `text` without leading and trailing blanks (space, tab, CR, LF).
std::string Trim(const char* text);

// Each returns false, leaving *out alone, when `text` is not a value of its kind.
bool ParseBool(const char* text, bool* out);
bool ParseInt(const char* text, int64_t* out);
bool ParseSize(const char* text, uint64_t* out);

}  // namespace vmmipc::config
