// The reaper's hand-over: the inbox (a socketpair) that CloseInBackground
// sends to, what is kept open in the host's table while it is full, and the
// reaper's public calls; its threads are reaper_threads.cc's.
#include "transport/reaper/fd_reaper.h"

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "common/log.h"
#include "common/parked.h"
#include "common/quiet_thread.h"
#include "common/syscall.h"
#include "transport/reaper/fd_disposal.h"
#include "transport/reaper/fd_kind.h"
#include "transport/reaper/reaper_state.h"
#include "transport/socket_io.h"

namespace vmmipc::transport {
namespace reaper_internal {

std::atomic<DisposalHook> g_disposal_hook{nullptr};
std::atomic<Reaper*> g_reaper{nullptr};
std::mutex g_create_mutex;

Reaper& Get() {
  Reaper* reaper = g_reaper.load(std::memory_order_acquire);
  if (reaper != nullptr) return *reaper;
  std::lock_guard lock(g_create_mutex);
  reaper = g_reaper.load(std::memory_order_relaxed);
  if (reaper == nullptr) {
    auto made = std::make_unique<Reaper>();
    made->overflow.reserve(kMaxKeptOpen);
    made->forever.reserve(kMaxKeptOpen);
    reaper = made.release();
    g_reaper.store(reaper, std::memory_order_release);
  }
  return *reaper;
}

}  // namespace reaper_internal

namespace {

using reaper_internal::CloseHostCopyOfInboxLocked;
using reaper_internal::g_create_mutex;
using reaper_internal::g_disposal_hook;
using reaper_internal::g_reaper;
using reaper_internal::Get;
using reaper_internal::Reaper;
using reaper_internal::ReplaceFailedPrivateThreadLocked;
using reaper_internal::StartLocked;

// One fd into the inbox, without waiting: false when its queue is full
// (every thread busy in a disposal that does not return) or the kernel
// refuses more fds in flight.
bool SendToInbox(int inbox, int fd, int host_fd) {
  const int payload = host_fd;
  const int fds[1] = {fd};
  const IoResult io =
      SendMessage(inbox, {reinterpret_cast<const uint8_t*>(&payload), sizeof(payload)}, fds,
                  Deadline::AfterMs(0));
  if (!io.ok()) errno = io.error != 0 ? io.error : EAGAIN;
  return io.ok();
}

// Under reaper.mutex. How many fds may wait in the inbox: in the host's
// table each of them is one of the host's fds.
size_t InboxLimitLocked(const Reaper& reaper) {
  return reaper.table.load() == ReaperTable::kShared ? kMaxInboxWaitingShared : kMaxInboxWaiting;
}

size_t KeptLocked(const Reaper& reaper) {
  return reaper.overflow.size() + reaper.forever.size() + reaper.lost;
}

// Under reaper.mutex, the reaper started. Into the inbox if it has room:
// false (and `fd` still ours) when every thread is stuck and kMaxInboxWaiting
// fds wait already, or the kernel refuses more.
bool SendLocked(Reaper& reaper, ScopedFd& fd) {
  if (reaper.pending.load() >= InboxLimitLocked(reaper)) return false;
  const bool private_table = reaper.table.load() != ReaperTable::kShared;
  reaper.pending.fetch_add(1);
  // Private table: the thread switches a socket's lingering off before
  // anything is closed for good, so our close may come before or after its
  // own, and is never the last (the inbox holds a reference). Host's table:
  // nothing is switched off, so our copy stays open and the thread closes it
  // after its own, being then the last.
  if (!SendToInbox(reaper.inbox_send, fd.get(), private_table ? -1 : fd.get())) {
    reaper.pending.fetch_sub(1);
    return false;
  }
  if (private_table) {
    fd.Reset();
  } else {
    (void)fd.Release();
  }
  return true;
}

// Under reaper.mutex. Kept open in the host's table instead of closed on
// this thread, where its close might wait (a peer's lingering socket queued
// on the connection). Never allocates within kMaxKeptOpen (reserved); past it
// (the importer and the listener have stopped taking peers' fds by then, so
// only what was already in flight comes), kept as long as memory lasts.
void KeepLocked(Reaper& reaper, ScopedFd fd, bool forever) {
  // A close that cannot wait on anyone (a memfd, a pipe, the driver's
  // device) is made here rather than kept: out of fds, where the reaper
  // could not even start, the fds of a failed fetch go at once.
  if (!forever && CloseNeverWaits(fd.get())) {
    fd.Reset();
    return;
  }
  std::vector<int>& list = forever ? reaper.forever : reaper.overflow;
  try {
    list.push_back(fd.get());
  } catch (...) {
    ++reaper.lost;  // no memory even for its number: left open all the same
  }
  (void)fd.Release();
  if (!reaper.keep_warned) {
    reaper.keep_warned = true;
    if (forever) {
      VMMIPC_LOG_WARN(
          "fd reaper: keeping a peer's fd open for the process's life: its every close may wait "
          "(a FUSE or NFS file); at most {} such fds and overflow together, then peers' fds "
          "are refused",
          kMaxKeptOpen);
    } else {
      VMMIPC_LOG_WARN(
          "fd reaper: its {} threads are stuck in disposals that do not return (a peer's fd "
          "whose close waits: a FUSE file whose daemon does not answer, a terminal) and {} fds "
          "wait in its inbox; keeping what comes now open instead of closing it on this thread "
          "(at most {}), and refusing fetches meanwhile",
          reaper.threads.load(), reaper.pending.load(), kMaxKeptOpen);
    }
  }
  if (KeptLocked(reaper) >= kMaxKeptOpen && !reaper.saturated_warned) {
    reaper.saturated_warned = true;
    VMMIPC_LOG_WARN(
        "fd reaper: {} fds are kept open, the most; the importer refuses fetches and the "
        "listener stops accepting until the reaper's threads take them",
        KeptLocked(reaper));
  }
}

// Under reaper.mutex, the reaper started: what the inbox had no room for,
// offered to it again in order while it has room now.
void OfferKeptLocked(Reaper& reaper) {
  size_t sent = 0;
  while (sent < reaper.overflow.size()) {
    ScopedFd fd(reaper.overflow[sent]);
    if (!SendLocked(reaper, fd)) {
      (void)fd.Release();
      break;
    }
    ++sent;
  }
  reaper.overflow.erase(reaper.overflow.begin(),
                        reaper.overflow.begin() + static_cast<ptrdiff_t>(sent));
}

}  // namespace

void CloseInBackground(ScopedFd fd) noexcept {
  if (!fd.valid()) return;
  Reaper* reaper = nullptr;
  try {
    reaper = &Get();
  } catch (...) {
    // No memory for the reaper itself: left open rather than closed here,
    // unless its close cannot wait.
    if (CloseNeverWaits(fd.get())) fd.Reset();
    (void)fd.Release();
    return;
  }
  std::lock_guard lock(reaper->mutex);
  bool started = false;
  try {
    started = StartLocked(*reaper);
  } catch (...) {
  }
  if (!started) {
    // No thread to take it (no socketpair, no thread): never a close here.
    KeepLocked(*reaper, std::move(fd), false);
    return;
  }
  ReplaceFailedPrivateThreadLocked(*reaper);
  CloseHostCopyOfInboxLocked(*reaper);
  OfferKeptLocked(*reaper);
  // Behind what waits already, so that the kept go first.
  if (!reaper->overflow.empty() || !SendLocked(*reaper, fd)) {
    KeepLocked(*reaper, std::move(fd), false);
  }
}

void KeepOpen(ScopedFd fd) noexcept {
  if (!fd.valid()) return;
  Reaper* reaper = nullptr;
  try {
    reaper = &Get();
  } catch (...) {
    (void)fd.Release();
    return;
  }
  std::lock_guard lock(reaper->mutex);
  KeepLocked(*reaper, std::move(fd), true);
}

bool ReaperCanKeepMore() noexcept {
  Reaper* reaper = g_reaper.load(std::memory_order_acquire);
  if (reaper == nullptr) return true;
  std::lock_guard lock(reaper->mutex);
  if (reaper->started) OfferKeptLocked(*reaper);
  return KeptLocked(*reaper) < kMaxKeptOpen;
}

bool ReaperTakesMore() noexcept {
  Reaper* reaper = g_reaper.load(std::memory_order_acquire);
  if (reaper == nullptr) return true;
  std::lock_guard lock(reaper->mutex);
  if (reaper->started) OfferKeptLocked(*reaper);
  return KeptLocked(*reaper) < kMaxKeptOpen &&
         (!reaper->started || reaper->pending.load() < InboxLimitLocked(*reaper));
}

bool NothingQueued(int connection) noexcept {
  uint8_t byte = 0;
  iovec iov{&byte, 1};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  const ssize_t n =
      RetryOnEintr([&] { return ::recvmsg(connection, &msg, MSG_PEEK | MSG_DONTWAIT); });
  // Empty (EAGAIN) or end of stream (0, no fds): nothing of the peer's is
  // left with us, and the close is ordinary. Anything else may hold fds.
  return (n < 0 && errno == EAGAIN) || (n == 0 && (msg.msg_flags & MSG_CTRUNC) == 0);
}

bool CloseConnection(ScopedFd connection) {
  if (!connection.valid()) return false;
  // After shutdown the peer can queue nothing more (its sends fail with
  // EPIPE), so one look at the queue is final for what can still arrive.
  ::shutdown(connection.get(), SHUT_RDWR);
  if (NothingQueued(connection.get())) return false;
  CloseInBackground(std::move(connection));
  return true;
}

void ResetReaperAfterFork() noexcept {
  Reaper* reaper = g_reaper.load(std::memory_order_relaxed);
  // The fds kept open stay open in the child too (CLOEXEC: gone at its
  // exec): a close of one here might wait as it would in the parent.
  if (reaper != nullptr) {
    // The child's copies of the inbox: its parent's threads hold theirs,
    // so these closes are never the last.
    if (reaper->inbox_send >= 0) ::close(reaper->inbox_send);
    if (reaper->inbox_receive >= 0) ::close(reaper->inbox_receive);
  }
  Park(reaper);
  new (&g_create_mutex) std::mutex();
  g_reaper.store(nullptr, std::memory_order_release);
}

ReaperTable ReaperTableInUse() noexcept {
  Reaper* reaper = g_reaper.load(std::memory_order_acquire);
  return reaper == nullptr ? ReaperTable::kNotStarted : reaper->table.load();
}

size_t ReaperPendingForTesting() noexcept {
  Reaper* reaper = g_reaper.load(std::memory_order_acquire);
  return reaper == nullptr ? 0 : reaper->pending.load();
}

size_t ReaperKeptForTesting() noexcept {
  Reaper* reaper = g_reaper.load(std::memory_order_acquire);
  if (reaper == nullptr) return 0;
  std::lock_guard lock(reaper->mutex);
  return KeptLocked(*reaper);
}

size_t ReaperThreadsForTesting() noexcept {
  Reaper* reaper = g_reaper.load(std::memory_order_acquire);
  return reaper == nullptr ? 0 : reaper->threads.load();
}

void SetDisposalHookForTesting(DisposalHook hook) noexcept { g_disposal_hook.store(hook); }

size_t ReaperHostFdsForTesting() noexcept {
  Reaper* reaper = g_reaper.load(std::memory_order_acquire);
  if (reaper == nullptr) return 0;
  std::lock_guard lock(reaper->mutex);
  return (reaper->inbox_send >= 0 ? 1 : 0) + (reaper->inbox_receive >= 0 ? 1 : 0);
}

void UseSharedTableForTesting() noexcept {
  Reaper& reaper = Get();
  std::lock_guard lock(reaper.mutex);
  reaper.shared_only = true;
}

}  // namespace vmmipc::transport
