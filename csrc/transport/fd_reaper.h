// The reaper: closes, on a thread of its own, descriptors whose last close may
// block. A peer can hand us an fd through SCM_RIGHTS (or leave one queued on a
// connection) whose final close() sleeps in the kernel: a TCP socket with
// unsent data and a long SO_LINGER blocks for the linger time, and the close
// of any fd of a file on which the host holds POSIX locks drops those locks.
// Such fds, and connections that may still hold them queued, are never closed
// on the listener's or an importer's thread: they come here. The thread is
// started on first use (never at load), with every signal blocked; the queue
// is bounded, and past the bound the fd is closed inline with one warning.
#pragma once

#include <cstddef>

#include "common/scoped_fd.h"

namespace vmmipc::transport {

// Takes ownership of `fd` and closes it in the background.
void CloseInBackground(ScopedFd fd) noexcept;

// A forked child: the parent's reaper thread does not exist there; forget its
// state without touching its lock (it may be held) and start afresh on next use.
void ResetReaperAfterFork() noexcept;

// Fds handed over so far and not yet closed (tests).
size_t ReaperPendingForTesting() noexcept;

}  // namespace vmmipc::transport
