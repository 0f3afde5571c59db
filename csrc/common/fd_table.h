// GrowFdTable: sizes the kernel's table of this process's fds once, ahead of
// need. The table grows by doubling (64, 128, 256, ...) as fds are opened, and
// in a multi-threaded process (every CUDA process) each growth waits for an RCU
// grace period while every other thread that opens an fd waits with it: 4-7 ms
// a growth on the H200 hosts (kernel 6.18), measured as single exports that
// took that long when the process's 64th and 128th fds were opened. An
// exporter keeps up to VMMIPC_EXPORT_FD_CACHE exported fds and an importer
// receives one per chunk of a run, so both would pay it several times, in
// the middle of an open.
#pragma once

namespace vmmipc {

// Grows the table to hold at least `fds` descriptors (at most the soft
// RLIMIT_NOFILE) and leaves nothing open. False when it did not grow it (the
// limit is lower, or no fd could be made): the table then grows as fds are
// opened, as without this call.
bool GrowFdTable(int fds) noexcept;

// The table's size now (FDSize in /proc/self/status); -1 when unknown.
int FdTableSize() noexcept;

}  // namespace vmmipc
