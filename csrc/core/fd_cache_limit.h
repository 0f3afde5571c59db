// The exported-fd cache's bound, which both the cache (core/export/
// exported_fds.h) and the fd table grown at load time (core/load_time.h) are
// sized by: its own file, in core/ beside load time, so that load time
// reaches nothing of core/export.
#pragma once

#include <cstddef>
#include <cstdint>

namespace vmmipc::core {

// `configured` (VMMIPC_EXPORT_FD_CACHE), but never more than a quarter of the
// fds the process may open (the soft RLIMIT_NOFILE), and at least one.
size_t FdCacheLimit(int64_t configured);

}  // namespace vmmipc::core
