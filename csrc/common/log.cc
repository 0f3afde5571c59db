// spdlog behind a small facade. The logger is created on first use (never at
// load time), writes to stderr or to the file of SetFile (VMMIPC_LOG_FILE,
// opened by OpenFile as the configuration is read, else by the first line,
// without waiting, and used only when it is this user's own regular file),
// and is intentionally never destroyed so that logging from other libraries'
// static destructors at exit stays safe.
#include "common/log.h"

#include <fcntl.h>
#include <pthread.h>
#include <spdlog/logger.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstring>
#include <mutex>
#include <string>

#include "common/log_file.h"
#include "common/log_limit.h"
#include "common/parked.h"

namespace vmmipc::log {
namespace {

std::atomic<int> g_level{static_cast<int>(Level::kWarn)};
std::atomic<int> g_rank{-1};
std::atomic<bool> g_rank_from_gpu{false};
std::atomic<spdlog::logger*> g_logger{nullptr};
std::mutex g_create_mutex;

// The log file, all guarded by g_create_mutex. A fixed buffer, not a
// std::string: no destructor at exit (the exit report still logs) and nothing
// to free in a forked child.
char g_file_pattern[PATH_MAX];  // empty: stderr
bool g_file_pattern_too_long = false;
int g_file_fd = -1;          // open log file; never closed while a logger may write to it
bool g_file_failed = false;  // open failed and was reported: stderr from now on

std::string Pattern() {
  int rank = g_rank.load(std::memory_order_relaxed);
  const char* kind = g_rank_from_gpu.load(std::memory_order_relaxed) ? "gpu slot" : "rank";
  std::string where = rank >= 0 ? fmt::format("{} {}", kind, rank) : std::string("unranked");
  // %P is evaluated per line, so a forked child logs its own pid.
  return fmt::format("[vmmipc pid %P {}] %l: %v", where);
}

// One write(2) per line (retried when short), so lines of processes that
// append to one file (a name without %p) never interleave within a line.
class FdSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit FdSink(int fd) : fd_(fd) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& message) override {
    spdlog::memory_buf_t line;
    formatter_->format(message, line);
    const char* data = line.data();
    size_t left = line.size();
    while (left > 0) {
      const ssize_t n = ::write(fd_, data, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // a full disk loses lines; it must not stop the host
      data += n;
      left -= static_cast<size_t>(n);
    }
  }
  void flush_() override {}

 private:
  const int fd_;
};

// Walks a file pattern: `literal` for each character kept, `host` and `pid`
// for each %h and %p.
template <typename Literal, typename Host, typename Pid>
void ScanPattern(std::string_view pattern, Literal literal, Host host, Pid pid) {
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      const char next = pattern[i + 1];
      if (next == 'h' || next == 'p' || next == '%') {
        ++i;
        if (next == 'h') host();
        if (next == 'p') pid();
        if (next == '%') literal('%');
        continue;
      }
    }
    literal(pattern[i]);  // other %-sequences are kept as written
  }
}

bool NameHasPid(std::string_view pattern) {
  bool has = false;
  auto keep = [](char) {};
  auto host = [] {};
  ScanPattern(pattern, keep, host, [&] { has = true; });
  return has;
}

std::string HostName() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "unknown-host";
  return name;
}

std::string TooLongLine() {
  return fmt::format(
      "cannot use VMMIPC_LOG_FILE: the name is longer than {} bytes; logging to stderr",
      PATH_MAX - 1);
}

// How the lines name the file of `pattern` in this process.
std::string Shown(const std::string& path, std::string_view pattern) {
  return path == pattern ? fmt::format("'{}'", path)
                         : fmt::format("'{}' (from '{}')", path, pattern);
}

// Opens the log file of SetFile; -1 and `why` when it cannot, or must not, be used.
int OpenLogFile(std::string* why) {
  if (g_file_pattern_too_long) {
    *why = TooLongLine();
    return -1;
  }
  const std::string path = ExpandFileName(g_file_pattern, HostName(), getpid());
  return OpenLogPath(path, Shown(path, g_file_pattern), /*create=*/true, why);
}

void ResetInForkedChild() { ResetAfterFork(); }

// Under g_create_mutex.
spdlog::logger* CreateLogger() {
  // A child forked by a process that logs but never made vmmipc's process
  // state (whose fork handler also calls ResetAfterFork) still gets a logger
  // of its own, and its own file with %p. Registered on first use, never at
  // load time; calling ResetAfterFork twice in a child is harmless.
  static bool fork_handler = pthread_atfork(nullptr, nullptr, ResetInForkedChild) == 0;
  (void)fork_handler;
  std::string why_not_file;
  const bool wanted = g_file_pattern[0] != '\0' || g_file_pattern_too_long;
  if (wanted && g_file_fd < 0 && !g_file_failed) {
    g_file_fd = OpenLogFile(&why_not_file);
    g_file_failed = g_file_fd < 0;
  }
  std::shared_ptr<spdlog::sinks::sink> sink;
  if (g_file_fd >= 0)
    sink = std::make_shared<FdSink>(g_file_fd);
  else
    sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto* logger = new spdlog::logger("vmmipc", std::move(sink));  // never freed, on purpose
  logger->set_level(spdlog::level::trace);                       // filtering happens in Enabled()
  logger->set_pattern(Pattern());
  // Once per process (per child with %p): why the lines are on stderr.
  if (!why_not_file.empty()) logger->log(spdlog::level::warn, why_not_file);
  return logger;
}

spdlog::logger* Logger() {
  spdlog::logger* logger = g_logger.load(std::memory_order_acquire);
  if (logger != nullptr) return logger;
  std::lock_guard<std::mutex> lock(g_create_mutex);
  logger = g_logger.load(std::memory_order_relaxed);
  if (logger == nullptr) {
    logger = CreateLogger();
    g_logger.store(logger, std::memory_order_release);
  }
  return logger;
}

spdlog::level::level_enum ToSpdlog(Level level) {
  switch (level) {
    case Level::kTrace:
      return spdlog::level::trace;
    case Level::kDebug:
      return spdlog::level::debug;
    case Level::kInfo:
      return spdlog::level::info;
    case Level::kWarn:
      return spdlog::level::warn;
    case Level::kError:
      return spdlog::level::err;
    case Level::kOff:
      return spdlog::level::off;
  }
  return spdlog::level::warn;
}

}  // namespace

constexpr LevelSpelling kLevelSpellings[] = {{"trace", Level::kTrace},  {"debug", Level::kDebug},
                                             {"info", Level::kInfo},    {"warn", Level::kWarn},
                                             {"warning", Level::kWarn}, {"error", Level::kError},
                                             {"off", Level::kOff},      {"none", Level::kOff}};

std::span<const LevelSpelling> LevelSpellings() { return kLevelSpellings; }

bool ParseLevel(std::string_view text, Level* level) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const LevelSpelling& entry : kLevelSpellings) {
    if (lower == entry.name) {
      *level = entry.level;
      return true;
    }
  }
  return false;
}

const char* LevelName(Level level) {
  switch (level) {
    case Level::kTrace:
      return "trace";
    case Level::kDebug:
      return "debug";
    case Level::kInfo:
      return "info";
    case Level::kWarn:
      return "warn";
    case Level::kError:
      return "error";
    case Level::kOff:
      return "off";
  }
  return "?";
}

void SetLevel(Level level) { g_level.store(static_cast<int>(level), std::memory_order_relaxed); }
Level GetLevel() { return static_cast<Level>(g_level.load(std::memory_order_relaxed)); }

void SetRank(int rank, bool from_gpu) {
  g_rank_from_gpu.store(from_gpu, std::memory_order_relaxed);
  g_rank.store(rank, std::memory_order_relaxed);
  spdlog::logger* logger = g_logger.load(std::memory_order_acquire);
  if (logger != nullptr) {
    try {
      logger->set_pattern(Pattern());
    } catch (...) {
    }
  }
}

void Write(Level level, std::string_view message) noexcept {
  const int saved_errno = errno;  // a log line must not change what the host sees
  try {
    Logger()->log(ToSpdlog(level), message);
  } catch (...) {
    // Logging must never take the host process down.
  }
  errno = saved_errno;
}

void SetFile(std::string_view pattern) noexcept {
  std::lock_guard<std::mutex> lock(g_create_mutex);
  const bool too_long = pattern.size() >= sizeof(g_file_pattern);
  if (!too_long && pattern == g_file_pattern && !g_file_pattern_too_long) return;
  const size_t kept = too_long ? 0 : pattern.size();
  std::memcpy(g_file_pattern, pattern.data(), kept);
  g_file_pattern[kept] = '\0';
  g_file_pattern_too_long = too_long;
  // An open file is retired, not closed: a thread may still be writing
  // through the old logger. In the library this runs once, before any file is
  // open, so nothing is left behind.
  g_file_fd = -1;
  g_file_failed = false;
  Park(g_logger.load(std::memory_order_relaxed));
  g_logger.store(nullptr, std::memory_order_release);
}

void OpenFile() noexcept {
  try {
    Logger();
  } catch (...) {
    // Out of memory: the first line tries again.
  }
}

std::string FileProblem(std::string_view pattern) {
  if (pattern.empty()) return {};
  if (pattern.size() >= sizeof(g_file_pattern)) return TooLongLine();
  const std::string path = FileNameHere(pattern);
  const std::string shown = Shown(path, pattern);
  std::string why;
  const int fd = OpenLogPath(path, shown, /*create=*/false, &why);
  if (fd >= 0) {
    ::close(fd);
    return {};
  }
  if (!why.empty()) return why;
  // Not there yet: the library creates it, in a folder that exists and that
  // this user may write to (the process's euid: AT_EACCESS).
  const size_t slash = path.rfind('/');
  const std::string folder =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  if (::faccessat(AT_FDCWD, folder.c_str(), W_OK | X_OK, AT_EACCESS) != 0)
    return fmt::format("cannot open VMMIPC_LOG_FILE {}: {}; logging to stderr", shown,
                       std::strerror(errno));
  return {};
}

std::string ExpandFileName(std::string_view pattern, std::string_view host, long pid) {
  std::string out;
  ScanPattern(
      pattern, [&](char c) { out += c; }, [&] { out += host; },
      [&] { out += std::to_string(pid); });
  return out;
}

std::string FileNameHere(std::string_view pattern) {
  return ExpandFileName(pattern, HostName(), getpid());
}

void ResetAfterFork() noexcept {
  ResetLineLimitsAfterFork();
  // The old logger (and its possibly locked mutex) is leaked, not destroyed.
  Park(g_logger.load(std::memory_order_relaxed));
  new (&g_create_mutex) std::mutex();
  // A name with %p was the parent's file: this child opens its own with its
  // next line. Only this thread exists, so nothing writes to the old fd now.
  if (NameHasPid(g_file_pattern)) {
    if (g_file_fd >= 0) ::close(g_file_fd);
    g_file_fd = -1;
    g_file_failed = false;
  }
  g_logger.store(nullptr, std::memory_order_release);
}

std::string Bytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return fmt::format("{} bytes", bytes);
  int unit = 0;
  while (unit + 1 < 6 && bytes >= (uint64_t{1} << (10 * (unit + 2)))) ++unit;
  const uint64_t size = uint64_t{1} << (10 * (unit + 1));
  if (bytes % size == 0) return fmt::format("{} {}", bytes / size, kUnits[unit]);
  return fmt::format("{:.1f} {}", static_cast<double>(bytes) / static_cast<double>(size),
                     kUnits[unit]);
}

}  // namespace vmmipc::log
