// The fd table's growth at load time, and what it did.
#include "core/load_time.h"

#include <atomic>

#include "common/fd_table.h"
#include "config/params.h"
#include "core/fd_cache_limit.h"

namespace vmmipc::core {
namespace {

constexpr int kNotRun = -1;
constexpr int kDisabled = -2;
std::atomic<int> g_growth{kNotRun};  // an EarlyGrowth, or one of the two above

}  // namespace

int FdTableSizeAtLoad() {
  // The defaults only: Params() parses params.def's default texts, never the
  // environment. A VMMIPC_EXPORT_FD_CACHE above the default lets the table
  // grow past this as fds are opened.
  return static_cast<int>(2 * FdCacheLimit(config::Params().export_fd_cache));
}

void GrowFdTableAtLoad() noexcept {
  try {
    if (!config::EnabledByEnvironment()) {
      g_growth = kDisabled;
      return;
    }
    g_growth = static_cast<int>(GrowFdTableWhileSingleThreaded(FdTableSizeAtLoad()));
  } catch (...) {
    // Out of memory at load time: the table grows as fds are opened.
  }
}

const char* FdTableAtLoad() noexcept {
  const int growth = g_growth.load();
  if (growth == kNotRun) return "not grown at load";
  if (growth == kDisabled) return "left alone at load: VMMIPC_ENABLE=0";
  return EarlyGrowthName(static_cast<EarlyGrowth>(growth));
}

}  // namespace vmmipc::core
