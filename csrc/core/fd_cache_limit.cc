// The exported-fd cache's bound from the configuration and RLIMIT_NOFILE.
#include "core/fd_cache_limit.h"

#include <sys/resource.h>

#include <algorithm>

namespace vmmipc::core {

size_t FdCacheLimit(int64_t configured) {
  rlimit limit{};
  size_t cap = static_cast<size_t>(configured);
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY)
    cap = std::min<size_t>(cap, std::max<rlim_t>(limit.rlim_cur / 4, 1));
  return std::max<size_t>(cap, 1);
}

}  // namespace vmmipc::core
