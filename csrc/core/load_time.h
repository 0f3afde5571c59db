// The one thing vmmipc does at load time: the fd table grown while the
// process still has one thread (common/fd_table.h), so that no export or
// open of its later, multi-threaded life waits for an RCU grace period to grow
// it. Called from the library's constructor (entry/load_time.cc); nothing
// else runs at load time.
#pragma once

namespace vmmipc::core {

// Grows the fd table to FdTableSizeAtLoad() entries when the process has one
// thread and VMMIPC_ENABLE (read alone, with getenv) leaves vmmipc on. Reads
// no other configuration (its reading logs), logs nothing, never waits:
// failures are silent and only remembered (FdTableAtLoad).
void GrowFdTableAtLoad() noexcept;

// What it grows to: twice the exported-fd cache's bound for the default
// VMMIPC_EXPORT_FD_CACHE (1024, at most a quarter of the soft RLIMIT_NOFILE):
// the cache's fds and as many again in flight (grants being sent, chunks being
// received). 2048 entries for the default: 16 KiB of kernel memory.
int FdTableSizeAtLoad();

// What GrowFdTableAtLoad did, for a debug line: common/fd_table.h's
// EarlyGrowthName, or why it did not run.
const char* FdTableAtLoad() noexcept;

}  // namespace vmmipc::core
