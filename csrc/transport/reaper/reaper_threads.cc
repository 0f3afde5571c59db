// The reaper's threads: the inbox they read, their start (the first one
// tries a private fd table, private_fd_table.h, and says where it settled),
// their life (receive, hold point, dispose), and the replacement of a thread
// whose private table failed.
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <memory>
#include <mutex>
#include <thread>

#include "common/log.h"
#include "common/parked.h"
#include "common/quiet_thread.h"
#include "common/syscall.h"
#include "transport/reaper/fd_disposal.h"
#include "transport/reaper/private_fd_table.h"
#include "transport/reaper/reaper_state.h"
#include "transport/socket_io.h"

#if defined(__SANITIZE_THREAD__)
#define VMMIPC_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define VMMIPC_TSAN 1
#endif
#endif

namespace vmmipc::transport::reaper_internal {
namespace {

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

}  // namespace

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

}  // namespace vmmipc::transport::reaper_internal
