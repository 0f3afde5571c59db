// Logging for a library that lives in someone else's process: one line per
// event on stderr (or the file VMMIPC_LOG_FILE names), tagged "vmmipc" with
// pid and rank, like NCCL_DEBUG output; and the one formatter of byte counts
// for log lines. spdlog stays behind log.cc (no spdlog in any header); fmt's
// compiled part is common/fmt_impl.cc's (or header-only: csrc/CMakeLists.txt).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace vmmipc::log {

enum class Level : int { kTrace = 0, kDebug, kInfo, kWarn, kError, kOff };

// Parses the spellings of LevelSpellings (case-insensitive).
bool ParseLevel(std::string_view text, Level* level);
struct LevelSpelling {
  const char* name;
  Level level;
};
// Every spelling ParseLevel takes, by level: its own name (LevelName) first,
// then its aliases ("warning", "none"). The docs list the same.
std::span<const LevelSpelling> LevelSpellings();
const char* LevelName(Level level);

void SetLevel(Level level);
Level GetLevel();
// The rank shown in every line ("rank N", or "gpu slot N" for a slot found
// from the GPU); negative means "no rank".
void SetRank(int rank, bool from_gpu = false);
inline bool Enabled(Level level) { return static_cast<int>(level) >= static_cast<int>(GetLevel()); }
// One line, one write(2), made under the sink's mutex (spdlog's), to a
// regular file (never a FIFO: SetFile) or to the host's stderr: a line waits
// for no reader of ours, so a caller may log while it holds its own locks.
void Write(Level level, std::string_view message) noexcept;
// Where lines go from the next one on: the file `pattern` names ("%h" the
// host name, "%p" the pid, "%%" a percent sign; VMMIPC_LOG_FILE), or stderr
// when it is empty. The file is opened by OpenFile, or else with the first
// line written after this call, never here, and never waits (O_NONBLOCK):
// O_WRONLY|O_APPEND|O_CREAT|O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC, mode 0600. It is
// used only if the opened fd is a regular file of this process's euid that
// neither group nor others can write (then O_NONBLOCK is cleared). If it
// cannot be opened or used (a symbolic link, a FIFO, another user's file, one
// others can write, ...), lines go to stderr, after one warning there that
// says why (whatever the level: it is why nothing reaches the file).
void SetFile(std::string_view pattern) noexcept;
// Opens the file of SetFile now, or gives it up with its one warning on
// stderr, instead of with the first line: config::Get() calls it as it reads
// the configuration, so that a bad VMMIPC_LOG_FILE is told at once, not after
// something else went wrong. Nothing more happens at the first line then.
void OpenFile() noexcept;
// What opening VMMIPC_LOG_FILE `pattern` in this process would say: the
// warning line of SetFile's refusal, or empty when the file would be used.
// Creates nothing: a file that is not there is judged by its folder (it must
// exist and be writable by this euid). For vmmipc-config, which reads the
// configuration without logging; `%p` is this process's pid.
std::string FileProblem(std::string_view pattern);
// The file name `pattern` stands for in process `pid` on host `host`.
std::string ExpandFileName(std::string_view pattern, std::string_view host, long pid);
// The same in this process, on this host.
std::string FileNameHere(std::string_view pattern);
// Called in a forked child: the parent's sink mutex may be held by a thread
// that does not exist in the child, so the logger is rebuilt. A file whose
// name holds "%p" is the parent's: the child opens its own with its next line.
// The child's rate limits (common/log_limit.h) count afresh.
void ResetAfterFork() noexcept;

// A byte count for people: whole binary units when exact ("4 MiB", "1 TiB"),
// one decimal when not ("3.5 MiB", "4.0 MiB" for 4 MiB + 1), exact bytes below
// 1 KiB ("512 bytes"). Addresses stay in hex; this is for sizes only.
std::string Bytes(uint64_t bytes);

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
