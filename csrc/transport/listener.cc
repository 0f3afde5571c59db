// The listener's lifecycle: bind the socket (abstract or filesystem), run the
// one accept thread, stop it promptly through an eventfd, and let a forked
// child walk away from a thread it does not have. Serving a connection is
// serve_connection.cc's job.
#include "transport/listener.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "common/log.h"
#include "common/parked.h"
#include "common/status.h"
#include "transport/fd_channel.h"
#include "transport/serve_connection.h"
#include "transport/socket_address.h"
#include "transport/wire.h"

namespace vmmipc::transport {
namespace {

// The accept loop's poll period: a safety net only, since Stop() wakes the
// thread through the eventfd at once.
constexpr int kPollPeriodMs = 200;
// How long to pause when accept() fails for lack of fds or memory: the
// pending connection stays queued, so retrying at once would spin.
constexpr int kAcceptBackoffMs = 100;
constexpr int kBacklog = 64;

}  // namespace

struct Listener::Impl {
  ListenerOptions options;
  ServeHandler handler;
  SocketAddress address;
  ScopedFd listen_fd;
  ScopedFd stop_fd;  // eventfd: readable once Stop() wrote it, and stays so
  // Heap-held so that a forked child can leak it: destroying a joinable
  // std::thread calls std::terminate, and joining a thread that does not
  // exist in the child would hang.
  std::unique_ptr<std::thread> thread;
  pid_t owner_pid = 0;  // getpid() at Start(): who may join the thread and unlink the path
  bool owns_path = false;
  dev_t path_dev = 0;
  ino_t path_ino = 0;

  // Every exit path of Start() and of the Listener ends here.
  ~Impl() { Stop(); }

  void Run() noexcept;
  void Stop() noexcept;
  void Abandon() noexcept;
  void UnlinkOwnPath() noexcept;
};

namespace {

// Prepares a filesystem socket path: a socket file left by a dead process
// (connect is refused) is removed; a live one, or any other kind of file, is
// left alone and reported.
bool ClearStalePath(const SocketAddress& address, std::string* error) {
  struct stat st {};
  if (::lstat(address.path.c_str(), &st) != 0) {
    if (errno == ENOENT) return true;
    *error = fmt::format("cannot inspect {}: {}", address.path, ErrnoText(errno));
    return false;
  }
  if (!S_ISSOCK(st.st_mode)) {
    *error = fmt::format("{} exists and is not a socket; not removing it", address.path);
    return false;
  }
  ScopedFd probe;
  const IoResult io = ConnectSeqpacket(address, Deadline::AfterMs(100), &probe);
  if (io.ok() || io.status == IoStatus::kTimeout) {
    *error = fmt::format(
        "{} is in use by a live listener (same uid and pid in another pid "
        "namespace sharing this directory?)",
        address.path);
    return false;
  }
  if (io.error != ECONNREFUSED) {
    *error = fmt::format("{} exists and cannot be probed: {}", address.path, ErrnoText(io.error));
    return false;
  }
  // ECONNREFUSED: nobody listens; a previous process of this pid died without
  // unlinking. Its file would make bind() fail with EADDRINUSE.
  if (::unlink(address.path.c_str()) != 0 && errno != ENOENT) {
    *error = fmt::format("cannot remove stale socket {}: {}", address.path, ErrnoText(errno));
    return false;
  }
  VMMIPC_LOG_INFO("listener: removed stale socket file {}", address.path);
  return true;
}

}  // namespace

void Listener::Impl::Run() noexcept {
  ServeContext context;
  context.key = wire::DeriveKey(options.token, options.pid);
  context.uid = ::geteuid();
  context.timeout_ms = std::max(options.timeout_ms, 1);
  context.stop_fd = stop_fd.get();
  context.handler = &handler;
  context.name = address.display;
  context.events = options.events;

  pollfd pfds[2] = {{listen_fd.get(), POLLIN, 0}, {stop_fd.get(), POLLIN, 0}};
  while (true) {
    pfds[0].revents = pfds[1].revents = 0;
    const int n = ::poll(pfds, 2, kPollPeriodMs);
    if (n < 0 && errno != EINTR) {
      VMMIPC_LOG_ERROR("listener {}: poll failed: {}; stopping", address.display, ErrnoText(errno));
      return;
    }
    if (pfds[1].revents != 0) return;
    if (n <= 0 || pfds[0].revents == 0) continue;
    // Non-blocking accept: a connection that went away between poll and
    // accept must not park the thread where Stop() cannot reach it.
    const int fd = ::accept4(listen_fd.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      const int error = errno;
      if (error == EAGAIN || error == EINTR || error == ECONNABORTED) continue;
      VMMIPC_LOG_WARN("listener {}: accept failed: {}; retrying in {} ms", address.display,
                      ErrnoText(error), kAcceptBackoffMs);
      pollfd stop{stop_fd.get(), POLLIN, 0};
      if (::poll(&stop, 1, kAcceptBackoffMs) > 0) return;
      continue;
    }
    ServeConnection(ScopedFd(fd), context);
  }
}

void Listener::Impl::UnlinkOwnPath() noexcept {
  if (!owns_path) return;
  owns_path = false;
  // Only the file this listener bound: if someone replaced it meanwhile, it is theirs.
  struct stat st {};
  if (::lstat(address.path.c_str(), &st) == 0 && st.st_dev == path_dev && st.st_ino == path_ino) {
    ::unlink(address.path.c_str());
  }
}

void Listener::Impl::Stop() noexcept {
  if (owner_pid != ::getpid()) {
    // A forked child that did not call AbandonAfterFork(): writing the shared
    // eventfd would stop the parent's listener, and the thread is not here.
    Abandon();
    return;
  }
  if (thread) {
    const uint64_t one = 1;
    if (RetryOnEintr([&] { return ::write(stop_fd.get(), &one, sizeof(one)); }) < 0) {
      VMMIPC_LOG_ERROR("listener {}: cannot wake the thread: {}", address.display,
                       ErrnoText(errno));
    }
    if (thread->joinable()) thread->join();
    thread.reset();
  }
  listen_fd.Reset();
  stop_fd.Reset();
  UnlinkOwnPath();
}

void Listener::Impl::Abandon() noexcept {
  Park(thread.release());  // leaked on purpose, see `thread`
  // Closing our copies leaves the parent's socket and eventfd untouched: they
  // are the same open files, still referenced by the parent's descriptors.
  listen_fd.Reset();
  stop_fd.Reset();
  owns_path = false;  // the path belongs to the parent's listener
}

std::unique_ptr<Listener> Listener::Start(const ListenerOptions& options, ServeHandler handler,
                                          std::string* error) {
  std::string local_error;
  if (error == nullptr) error = &local_error;
  try {
    auto impl = std::make_unique<Impl>();
    impl->options = options;
    impl->handler = std::move(handler);
    impl->owner_pid = ::getpid();
    if (!impl->handler) {
      *error = "listener: no handler";
      return nullptr;
    }
    if (!MakeSocketAddress(::geteuid(), options.pid, options.socket_dir, &impl->address, error)) {
      return nullptr;
    }
    const SocketAddress& address = impl->address;

    impl->listen_fd.Reset(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!impl->listen_fd) {
      *error = fmt::format("listener {}: socket: {}", address.display, ErrnoText(errno));
      return nullptr;
    }
    if (!address.abstract && !ClearStalePath(address, error)) return nullptr;
    // The file bind() creates takes the socket's own mode (minus the umask):
    // set here, it is 0600 from birth. A chmod by path after bind would follow
    // a symlink swapped in meanwhile. The uid check is the real one anyway.
    if (!address.abstract && ::fchmod(impl->listen_fd.get(), 0600) != 0) {
      *error = fmt::format("listener {}: fchmod: {}", address.display, ErrnoText(errno));
      return nullptr;
    }
    if (::bind(impl->listen_fd.get(), address.get(), address.length) != 0) {
      const int e = errno;
      if (e == EADDRINUSE && address.abstract) {
        *error = fmt::format(
            "listener {}: the name is already bound by another process of this uid in this "
            "network namespace (a process of the same pid in another pid namespace?)",
            address.display);
      } else {
        *error = fmt::format("listener {}: bind: {}", address.display, ErrnoText(e));
      }
      return nullptr;
    }
    if (!address.abstract) {
      struct stat st {};
      if (::lstat(address.path.c_str(), &st) == 0) {
        impl->owns_path = true;
        impl->path_dev = st.st_dev;
        impl->path_ino = st.st_ino;
      }
    }
    if (::listen(impl->listen_fd.get(), kBacklog) != 0) {
      *error = fmt::format("listener {}: listen: {}", address.display, ErrnoText(errno));
      return nullptr;
    }
    impl->stop_fd.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!impl->stop_fd) {
      *error = fmt::format("listener {}: eventfd: {}", address.display, ErrnoText(errno));
      return nullptr;
    }

    // The thread starts with every signal blocked, so that the host process's
    // signal handlers never run on it (they may assume their own threads).
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    try {
      Impl* raw = impl.get();
      impl->thread = std::make_unique<std::thread>([raw] {
        pthread_setname_np(pthread_self(), "vmmipc-listen");
        raw->Run();
      });
    } catch (const std::exception& e) {
      pthread_sigmask(SIG_SETMASK, &previous, nullptr);
      *error = fmt::format("listener {}: cannot start the thread: {}", address.display, e.what());
      return nullptr;
    }
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    VMMIPC_LOG_DEBUG("listener {}: serving", address.display);
    return std::unique_ptr<Listener>(new Listener(std::move(impl)));
  } catch (const std::exception& e) {
    *error = fmt::format("listener: {}", e.what());
    return nullptr;
  }
}

Listener::Listener(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Listener::~Listener() = default;  // ~Impl stops the thread

void Listener::AbandonAfterFork() noexcept {
  if (impl_) impl_->Abandon();
}

const std::string& Listener::address() const { return impl_->address.display; }

}  // namespace vmmipc::transport
