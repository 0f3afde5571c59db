// The configuration of vmmipc: every VMMIPC_* variable is declared once in
// params.def (name, kind, default, doc), parsed once, and read through Get().
// Invalid values are warned about and ignored (the default stays).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "common/log.h"

namespace vmmipc::config {

enum class Kind { kBool, kInt, kSize, kString, kLogLevel };

struct ParamSpec {
  const char* name;
  Kind kind;
  const char* default_text;
  const char* doc;
};

struct Params {
  bool enable = true;
  log::Level log_level = log::Level::kWarn;
  int64_t rank = -1;
  uint64_t zone_base = 0;
  uint64_t zone_fallback_base = 0;
  int64_t zone_slots = 0;
  uint64_t slot_size = 0;
  int64_t timeout_ms = 0;
  std::string socket_dir;
  std::string cuda_library;
  bool force_posix_fd = true;
  bool arena = true;
  uint64_t arena_base = 0;
  uint64_t arena_size = 0;
  bool stats = false;
  int64_t export_fd_cache = 1024;
  int64_t listener_threads = 4;
  // Derived: where the rank came from ("VMMIPC_RANK", "LOCAL_RANK", "RANK" or "none").
  std::string rank_source = "none";
};

using EnvLookup = std::function<const char*(const char*)>;

std::span<const ParamSpec> AllParams();
// Parses every parameter through `lookup` (getenv in production).
Params Parse(const EnvLookup& lookup);
// The process's parameters, parsed from the environment on first call.
const Params& Get();

// Value parsers, exposed for tests. They accept surrounding whitespace.
bool ParseBool(const char* text, bool* out);
bool ParseInt(const char* text, int64_t* out);
bool ParseSize(const char* text, uint64_t* out);

}  // namespace vmmipc::config
