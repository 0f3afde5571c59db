// The reaper: closes, off every thread that anything waits on, descriptors
// whose last close may block. A peer can hand us an fd through SCM_RIGHTS (or
// leave one queued on a connection) whose final close() sleeps in the kernel: a
// TCP socket with unsent data and a long SO_LINGER blocks for the linger time.
// Such fds, and connections that may still hold them queued, come here.
//
// CloseInBackground sends the fd over an inbox socketpair and closes our own
// copy at once: that close is never the last one (the inbox holds a reference),
// so it cannot block, and what waits for the reaper waits in the kernel's
// socket queue, not in the host's fd table. Reaper threads (started on first
// use, never at load, every signal blocked; one kept idle beside the busy ones,
// at most kMaxReaperThreads) take the fds out and dispose of them
// (fd_disposal.h): in a private fd table when the kernel lets us make one, so
// that what a peer queued can be taken apart (sockets' lingering switched
// off) without its fds ever entering the host's table, and without a close
// there dropping the host's POSIX locks; else in the host's table, as plain
// closes, where the sender's copy stays open for the thread to close last.
//
// Nothing here ever closes on the caller's thread. A disposal may still not
// return (a peer's FUSE file whose daemon never answers FLUSH: every close of
// it waits, not only the last): such a thread is lost for the process's life,
// and at most kMaxReaperThreads are. While they are all stuck, at most
// kMaxInboxWaiting fds wait in the inbox; past that an fd handed over is kept
// open in the host's table instead (offered again once there is room), at
// most kMaxKeptOpen of them, with one warning; and ReaperTakesMore() says no,
// so that the importer refuses new fetches and the listener stops accepting
// rather than take more of a peer's fds. docs/security.md has the budget.
#pragma once

#include <cstddef>

#include "common/scoped_fd.h"

namespace vmmipc::transport {

// Threads that dispose of fds, at most: each stuck one is lost for good.
inline constexpr size_t kMaxReaperThreads = 4;
// Fds waiting in the inbox for a thread, at most: in the reaper's private
// table they cost the host nothing but kernel memory (the inbox's queue, at
// most 8 MiB); in the host's table each is one of the host's fds.
inline constexpr size_t kMaxInboxWaiting = 1024;
inline constexpr size_t kMaxInboxWaitingShared = 64;
// Fds kept open in the host's table rather than closed: what the inbox had
// no room for, and what must never be closed (KeepOpen), together.
inline constexpr size_t kMaxKeptOpen = 64;

// Takes ownership of `fd` and closes it in the background; never on this
// thread: without room in the inbox it is kept open (KeepOpen's budget) and
// offered to the reaper again at a later hand-over.
void CloseInBackground(ScopedFd fd) noexcept;

// Takes ownership of `fd`, a peer's fd that is in the host's table and whose
// every close may wait (a regular file of FUSE or NFS: its flush), so that no
// thread of the host's table may close it: kept open until the process
// exits, never closed by vmmipc, counted against kMaxKeptOpen.
void KeepOpen(ScopedFd fd) noexcept;

// False once kMaxKeptOpen fds are kept: the listener then stops accepting
// (a connection may carry a peer's fds, on kernels without SO_PASSRIGHTS).
bool ReaperCanKeepMore() noexcept;

// False while what is handed over would be kept rather than disposed of (the
// inbox is full: every thread stuck) or kMaxKeptOpen fds are kept already:
// then nothing more of a peer's should be taken. Offers the kept fds to the
// inbox again first, when it has room.
bool ReaperTakesMore() noexcept;

// Whether nothing is queued on `connection` (or its peer hung up and left
// nothing): its close is then ordinary, never the one that frees a peer's
// queued fds. Looks without waiting and without taking anything.
bool NothingQueued(int connection) noexcept;

// Closes a connection whose peer may have queued fds we never received:
// shuts it down, and when something is still queued, hands it to the reaper
// so that the last close of those fds cannot block this thread. Returns true
// when it went to the reaper.
bool CloseConnection(ScopedFd connection);

// A forked child: the parent's reaper threads do not exist there; forget
// their state without touching their lock (it may be held), close the
// child's copies of the inbox, and start afresh on next use.
void ResetReaperAfterFork() noexcept;

// Where the reaper threads dispose of fds.
enum class ReaperTable {
  kNotStarted,
  kPrivate,  // their own fd table: queued fds are taken apart, never reach the host's table
  kShared,   // the host's table (no pidfd_getfd or close_range here): plain closes
};
ReaperTable ReaperTableInUse() noexcept;

// Fds handed over so far and not yet disposed of (tests).
size_t ReaperPendingForTesting() noexcept;
// Fds kept open in the host's table now (tests).
size_t ReaperKeptForTesting() noexcept;
// Fds the reaper keeps in the host's table from its first use on: its
// inbox's sending end (1), and the receiving end too where its threads run in
// the host's table (2); 0 before the first use (tests' leak checks).
size_t ReaperHostFdsForTesting() noexcept;
// Reaper threads started so far (tests).
size_t ReaperThreadsForTesting() noexcept;
// A hold point: called on a reaper thread with each fd before its disposal
// (nullptr: none). Tests stage a disposal that does not return with it.
using DisposalHook = void (*)(int fd);
void SetDisposalHookForTesting(DisposalHook hook) noexcept;
// Before the first use: run in the host's table, as where the kernel lacks
// what a private table needs (tests of that path).
void UseSharedTableForTesting() noexcept;

}  // namespace vmmipc::transport
