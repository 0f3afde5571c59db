// The fd table: its size read, and grown once ahead of need. The kernel's
// table of a process's fds starts with 64 entries and doubles (128, 256, ...)
// when an fd is opened past its end. In a process of more than one thread
// (every CUDA process) each growth waits for an RCU grace period
// (expand_fdtable calls synchronize_rcu() when the table is shared), and every
// other thread that needs an fd past the end meanwhile waits with it
// (docs/driver-behaviour.md#fd-table-growth: measured as single exports that
// took milliseconds when the process's 64th and 128th fds were opened). An exporter
// keeps up to VMMIPC_EXPORT_FD_CACHE exported fds and an importer receives one
// per chunk of a run, so both would pay it several times, in the middle of an
// open. In a process of one thread the same growth waits for nothing (a few
// microseconds, docs/driver-behaviour.md): vmmipc grows the table at load time,
// while the process still has one thread (core/load_time.h).
#pragma once

namespace vmmipc {

// What /proc/self/status says of the table and the threads, read in one pass
// (no allocation); -1 for what is unknown.
struct FdTableStatus {
  int size = -1;     // FDSize: the entries the table holds now
  int threads = -1;  // Threads: the process's threads
};
FdTableStatus ReadFdTableStatus() noexcept;

// The table's size now (FDSize); -1 when unknown.
int FdTableSize() noexcept;

// Grows the table to hold at least `fds` descriptors (at most the soft
// RLIMIT_NOFILE) and leaves nothing open: one eventfd of its own, duplicated
// at `fds - 1` and both closed. Never one of the process's fds: the close of
// any copy of a file drops every POSIX record lock the process holds on it.
// False when it did not grow it (large enough already, the limit lower, no
// fd could be made): the table then grows as fds are opened, as without it.
// In a process of more than one thread it waits for a grace period.
bool GrowFdTable(int fds) noexcept;

// What GrowFdTableWhileSingleThreaded did.
enum class EarlyGrowth {
  kGrown,        // the table holds `fds` now
  kLargeEnough,  // it did already, or the soft limit is no larger
  kThreaded,     // the process has more than one thread: left alone
  kUnknown,      // /proc/self/status could not be read: left alone
  kFailed,       // no fd could be made, or the kernel refused the growth
};
// GrowFdTable, only while the process has one thread (read in the same pass
// as the table's size): then the growth waits for no grace period. A process
// with more threads is left alone, since its growth would wait for one.
EarlyGrowth GrowFdTableWhileSingleThreaded(int fds) noexcept;
const char* EarlyGrowthName(EarlyGrowth growth) noexcept;

}  // namespace vmmipc
