// The reaper's inbox (a socketpair) and its threads, which move into a
// private fd table (private_fd_table.h) where they can.
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
#include "transport/reaper/private_fd_table.h"
#include "transport/socket_io.h"

#if defined(__SANITIZE_THREAD__)
#define VMMIPC_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define VMMIPC_TSAN 1
#endif
#endif

namespace vmmipc::transport {
namespace {

struct Reaper {
  std::mutex mutex;        // guards the fields below that say so
  bool started = false;    // guarded by mutex
  int inbox_send = -1;     // host table: CloseInBackground sends here (set under mutex, then fixed)
  int inbox_receive = -1;  // host table's copy of the other end (guarded by mutex)
  bool shared_only = false;                       // guarded by mutex: never try a private table
  std::atomic<bool> private_inbox_ready{false};   // the private table holds its own copy
  std::atomic<bool> private_table_failed{false};  // unshared, then could not get the inbox
  std::atomic<ReaperTable> table{ReaperTable::kNotStarted};
  // The first thread says where it settled (table above); its starter waits for that.
  std::mutex settled_mutex;
  std::condition_variable settled;
  std::atomic<size_t> threads{0};
  std::atomic<size_t> idle{0};
  std::atomic<size_t> pending{0};
  // Guarded by mutex: fds kept open in the host's table, never closed here.
  // `overflow`: handed over while the inbox was full, offered to it again
  // at later hand-overs; `forever`: KeepOpen's, never closed by anyone.
  // Room for kMaxKeptOpen of each is reserved when the reaper is made, so
  // that keeping one does not allocate.
  std::vector<int> overflow;
  std::vector<int> forever;
  size_t lost = 0;                // guarded by mutex: fds past even that, left open uncounted there
  bool keep_warned = false;       // guarded by mutex
  bool saturated_warned = false;  // guarded by mutex
};

std::atomic<DisposalHook> g_disposal_hook{nullptr};

// Never destroyed: the threads run until the process exits.
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

void StartThread(Reaper& reaper, int inbox, bool private_table) noexcept;

// Receives one message of fds from the inbox; blocks. Fills `fds` (at most
// `capacity`) and returns how many, 0 for a message without fds, -1 when the
// inbox is unusable. `*host_fd`: the sender's own number of the fd, left for
// this thread to close (the host's table only), or -1.
int ReceiveFds(int inbox, int* fds, int capacity, int* host_fd) {
  *host_fd = -1;
  int payload = -1;
  iovec iov{&payload, sizeof(payload)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = RetryOnEintr([&] { return ::recvmsg(inbox, &msg, MSG_CMSG_CLOEXEC); });
  if (n <= 0) return -1;
  if (n == sizeof(payload)) *host_fd = payload;
  int count = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const int* received = reinterpret_cast<const int*>(CMSG_DATA(c));
    const size_t in_record = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < in_record; ++i) {
      if (count < capacity) {
        fds[count++] = received[i];
      } else {
        ::close(received[i]);
      }
    }
  }
  return count;
}

// A reaper thread's life. Never logs: in a private table the fd numbers are
// not the host's (the log file's number may be a peer's fd here).
void Run(Reaper& reaper, int inbox, bool private_table) noexcept {
  while (true) {
    int fds[4];
    int host_fd = -1;
    const int count = ReceiveFds(inbox, fds, 4, &host_fd);
    if (count < 0) return;
    // Taken: keep one thread idle for the next, unless at the cap. The new
    // thread shares this one's table (pthread_create shares the caller's).
    if (reaper.idle.fetch_sub(1) == 1 && reaper.threads.load() < kMaxReaperThreads) {
      StartThread(reaper, inbox, private_table);
    }
    for (int i = 0; i < count; ++i) {
      if (DisposalHook hook = g_disposal_hook.load(); hook != nullptr) hook(fds[i]);
      if (private_table) {
        DisposalCounts counts;
        DisposeOfPeerFd(fds[i], &counts);
      } else {
        ::close(fds[i]);
      }
    }
    // In the host's table the sender left its own number open for us, so
    // that the last close, which may block, is this thread's.
    if (!private_table && host_fd >= 0) ::close(host_fd);
    reaper.pending.fetch_sub(1);
    reaper.idle.fetch_add(1);
  }
}

void Settle(Reaper& reaper, ReaperTable table) {
  {
    std::lock_guard lock(reaper.settled_mutex);
    reaper.table.store(table);
  }
  reaper.settled.notify_all();
}

void FirstThread(Reaper& reaper, int inbox, bool try_private) noexcept {
  int own = -1;
  bool unshared = false;
#ifndef VMMIPC_TSAN
  // ThreadSanitizer keys its fd bookkeeping by number for the whole process;
  // a second table's numbers would read to it as races with the host's.
  if (try_private) own = EnterPrivateFdTable(inbox, &unshared);
#else
  (void)try_private;
#endif
  if (own >= 0) {
    reaper.private_inbox_ready.store(true);
    Settle(reaper, ReaperTable::kPrivate);
    Run(reaper, own, true);
    return;
  }
  if (unshared) {
    // A table of our own but no inbox in it (pidfd_getfd worked a moment
    // ago): this thread can do nothing; the next hand-over starts one in
    // the host's table.
    reaper.threads.fetch_sub(1);
    reaper.idle.fetch_sub(1);
    reaper.private_table_failed.store(true);
    Settle(reaper, ReaperTable::kShared);
    return;
  }
  Settle(reaper, ReaperTable::kShared);
  Run(reaper, inbox, false);
}

void StartThread(Reaper& reaper, int inbox, bool private_table) noexcept {
  reaper.threads.fetch_add(1);
  reaper.idle.fetch_add(1);
  try {
    StartQuietThread("vmmipc-reaper", [&reaper, inbox, private_table] {
      Run(reaper, inbox, private_table);
    })->detach();
  } catch (...) {
    // No thread: the busy ones go on; the next take tries again.
    reaper.threads.fetch_sub(1);
    reaper.idle.fetch_sub(1);
  }
}

// Under reaper.mutex. Once the threads hold their own copy of the inbox,
// the host's copy of the receiving end only costs an fd.
void CloseHostCopyOfInboxLocked(Reaper& reaper) {
  if (reaper.inbox_receive >= 0 && reaper.private_inbox_ready.load()) {
    ::close(reaper.inbox_receive);
    reaper.inbox_receive = -1;
  }
}

// Under reaper.mutex. A first thread that unshared its table but found no
// inbox there is gone; one in the host's table takes its place.
void ReplaceFailedPrivateThreadLocked(Reaper& reaper) {
  if (!reaper.private_table_failed.exchange(false) || reaper.inbox_receive < 0) return;
  reaper.shared_only = true;
  StartThread(reaper, reaper.inbox_receive, false);
}

// Under reaper.mutex.
bool StartLocked(Reaper& reaper) {
  if (reaper.started) return true;
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    VMMIPC_LOG_WARN("fd reaper: socketpair: {}; closing inline", ErrnoText(errno));
    return false;
  }
  // Room in the inbox for thousands of fds in flight while every thread is
  // busy (about 1 KiB of kernel memory each; the default buffer holds ~280).
  // SO_SNDBUFFORCE passes net.core.wmem_max where we may (CAP_NET_ADMIN).
  const int inbox_bytes = 8 << 20;
  if (::setsockopt(pair[0], SOL_SOCKET, SO_SNDBUFFORCE, &inbox_bytes, sizeof(inbox_bytes)) != 0) {
    ::setsockopt(pair[0], SOL_SOCKET, SO_SNDBUF, &inbox_bytes, sizeof(inbox_bytes));
  }
  reaper.threads.store(1);
  reaper.idle.store(1);
  const bool try_private = !reaper.shared_only;
  try {
    const int inbox = pair[1];
    StartQuietThread("vmmipc-reaper", [&reaper, inbox, try_private] {
      FirstThread(reaper, inbox, try_private);
    })->detach();
  } catch (const std::exception& e) {
    VMMIPC_LOG_WARN("cannot start the fd reaper thread: {}; closing inline", e.what());
    ::close(pair[0]);
    ::close(pair[1]);
    reaper.threads.store(0);
    reaper.idle.store(0);
    return false;
  }
  reaper.inbox_send = pair[0];
  reaper.inbox_receive = pair[1];
  reaper.started = true;
  // Once, at the first hand-over: wait (microseconds; bounded) until the
  // thread has its own copy of the receiving end, so that the host's copy
  // goes now rather than at some later hand-over.
  std::unique_lock settled(reaper.settled_mutex);
  reaper.settled.wait_for(settled, std::chrono::seconds(1),
                          [&] { return reaper.table.load() != ReaperTable::kNotStarted; });
  settled.unlock();
  ReplaceFailedPrivateThreadLocked(reaper);
  CloseHostCopyOfInboxLocked(reaper);
  return true;
}

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

bool CloseConnection(ScopedFd connection) {
  if (!connection.valid()) return false;
  // After shutdown the peer can queue nothing more (its sends fail with
  // EPIPE), so one look at the queue is final for what can still arrive.
  ::shutdown(connection.get(), SHUT_RDWR);
  uint8_t byte = 0;
  iovec iov{&byte, 1};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  const ssize_t n =
      RetryOnEintr([&] { return ::recvmsg(connection.get(), &msg, MSG_PEEK | MSG_DONTWAIT); });
  // Empty (EAGAIN) or end of stream (0, no fds): nothing of the peer's is
  // left with us, and the close is ordinary. Anything else may hold fds.
  const bool empty = (n < 0 && errno == EAGAIN) || (n == 0 && (msg.msg_flags & MSG_CTRUNC) == 0);
  if (empty) return false;
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
