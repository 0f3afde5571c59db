// spdlog behind a small facade. The logger is created on first use (never at
// load time), writes to stderr, and is intentionally never destroyed so that
// logging from other libraries' static destructors at exit stays safe.
#include "common/log.h"

#include <spdlog/logger.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <mutex>
#include <string>

#include "common/parked.h"

namespace vmmipc::log {
namespace {

std::atomic<int> g_level{static_cast<int>(Level::kWarn)};
std::atomic<int> g_rank{-1};
std::atomic<bool> g_rank_from_gpu{false};
std::atomic<spdlog::logger*> g_logger{nullptr};
std::mutex g_create_mutex;

std::string Pattern() {
  int rank = g_rank.load(std::memory_order_relaxed);
  const char* kind = g_rank_from_gpu.load(std::memory_order_relaxed) ? "gpu slot" : "rank";
  std::string where = rank >= 0 ? fmt::format("{} {}", kind, rank) : std::string("unranked");
  // %P is evaluated per line, so a forked child logs its own pid.
  return fmt::format("[vmmipc pid %P {}] %l: %v", where);
}

spdlog::logger* CreateLogger() {
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto* logger = new spdlog::logger("vmmipc", std::move(sink));  // never freed, on purpose
  logger->set_level(spdlog::level::trace);                        // filtering happens in Enabled()
  logger->set_pattern(Pattern());
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
    case Level::kTrace: return spdlog::level::trace;
    case Level::kDebug: return spdlog::level::debug;
    case Level::kInfo: return spdlog::level::info;
    case Level::kWarn: return spdlog::level::warn;
    case Level::kError: return spdlog::level::err;
    case Level::kOff: return spdlog::level::off;
  }
  return spdlog::level::warn;
}

}  // namespace

bool ParseLevel(std::string_view text, Level* level) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  static constexpr struct {
    const char* name;
    Level level;
  } kNames[] = {{"trace", Level::kTrace}, {"debug", Level::kDebug}, {"info", Level::kInfo},
                {"warn", Level::kWarn},   {"warning", Level::kWarn}, {"error", Level::kError},
                {"off", Level::kOff},     {"none", Level::kOff}};
  for (const auto& entry : kNames) {
    if (lower == entry.name) {
      *level = entry.level;
      return true;
    }
  }
  return false;
}

const char* LevelName(Level level) {
  switch (level) {
    case Level::kTrace: return "trace";
    case Level::kDebug: return "debug";
    case Level::kInfo: return "info";
    case Level::kWarn: return "warn";
    case Level::kError: return "error";
    case Level::kOff: return "off";
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
  try {
    Logger()->log(ToSpdlog(level), message);
  } catch (...) {
    // Logging must never take the host process down.
  }
}

void ResetAfterFork() noexcept {
  // The old logger (and its possibly locked mutex) is leaked, not destroyed.
  Park(g_logger.load(std::memory_order_relaxed));
  new (&g_create_mutex) std::mutex();
  g_logger.store(nullptr, std::memory_order_release);
}

}  // namespace vmmipc::log
