// Logging for a library that lives in someone else's process: one line per
// event on stderr, tagged "vmmipc" with pid and rank, like NCCL_DEBUG output.
// spdlog stays behind log.cc (no spdlog in any header); fmt is header-only.
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace vmmipc::log {

enum class Level : int { kTrace = 0, kDebug, kInfo, kWarn, kError, kOff };

// Parses "trace|debug|info|warn|warning|error|off" (case-insensitive).
bool ParseLevel(std::string_view text, Level* level);
const char* LevelName(Level level);

void SetLevel(Level level);
Level GetLevel();
// The rank shown in every line ("rank N", or "gpu slot N" for a slot found
// from the GPU); negative means "no rank".
void SetRank(int rank, bool from_gpu = false);
inline bool Enabled(Level level) { return static_cast<int>(level) >= static_cast<int>(GetLevel()); }
void Write(Level level, std::string_view message) noexcept;
// Called in a forked child: the parent's sink mutex may be held by a thread
// that does not exist in the child, so the logger is rebuilt.
void ResetAfterFork() noexcept;

template <typename... Args>
void Log(Level level, fmt::format_string<Args...> format, Args&&... args) noexcept {
  if (!Enabled(level)) return;
  try {
    Write(level, fmt::format(format, std::forward<Args>(args)...));
  } catch (...) {
    Write(level, "(log line could not be formatted)");
  }
}

}  // namespace vmmipc::log

#define VMMIPC_LOG_TRACE(...) ::vmmipc::log::Log(::vmmipc::log::Level::kTrace, __VA_ARGS__)
#define VMMIPC_LOG_DEBUG(...) ::vmmipc::log::Log(::vmmipc::log::Level::kDebug, __VA_ARGS__)
#define VMMIPC_LOG_INFO(...) ::vmmipc::log::Log(::vmmipc::log::Level::kInfo, __VA_ARGS__)
#define VMMIPC_LOG_WARN(...) ::vmmipc::log::Log(::vmmipc::log::Level::kWarn, __VA_ARGS__)
#define VMMIPC_LOG_ERROR(...) ::vmmipc::log::Log(::vmmipc::log::Level::kError, __VA_ARGS__)
