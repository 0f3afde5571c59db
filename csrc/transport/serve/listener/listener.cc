// The listener's lifecycle: start (the socket bound by listener_socket.h,
// the stop eventfd, the context every connection is served with, the first
// fd budget, the poll thread), stop everything promptly through the
// eventfd, and let a forked child walk away from threads it does not have.
// The poll thread's loop is listener_poll.cc, its admission admission.h,
// the workers listener_workers.h; what happens on one
// connection is serve_connection.cc's.
#include "transport/serve/listener/listener.h"

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/log.h"
#include "common/parked.h"
#include "common/quiet_thread.h"
#include "common/syscall.h"
#include "transport/reaper/fd_reaper.h"
#include "transport/serve/fd_budget.h"
#include "transport/serve/listener/listener_impl.h"
#include "transport/serve/listener/listener_socket.h"
#include "transport/socket_uid.h"

namespace vmmipc::transport {
namespace {

// The listening socket's own name, and its fd.
struct ListenerName {
  sockaddr_storage address{};
  socklen_t length = 0;
  int listen_fd = -1;
};

// A forked child's copies of every connection the listener accepted: those
// waiting for their request or kept for the next one (the poll thread's
// lists, which no lock guards: the thread may have been changing them at the
// fork), those queued or being answered, those on their way to the reaper.
// Each has the listening socket's name as its own (the kernel gives an
// accepted Unix socket its listener's address), and no other socket of the
// process has it (a name is bound once; a client socket has none): they are
// found by name in /proc/self/fd and closed. Plain closes of the child's
// copies: a shutdown() would end the parent's connections too. One with
// something queued stays open (until the child's exec or exit): were the
// parent's reaper to close its copy meanwhile, ours would be the close that
// frees a peer's queued fds, which may wait. No allocation.
void CloseAcceptedCopies(int listen_fd) noexcept {
  ListenerName name;
  name.listen_fd = listen_fd;
  name.length = sizeof(name.address);
  if (listen_fd < 0 ||
      ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&name.address), &name.length) != 0 ||
      name.length <= sizeof(sa_family_t))  // unnamed: never
    return;
  ForEachOpenFd(
      [](int fd, void* arg) {
        const ListenerName& listener = *static_cast<const ListenerName*>(arg);
        if (fd == listener.listen_fd) return;
        sockaddr_storage own{};
        socklen_t length = sizeof(own);
        if (::getsockname(fd, reinterpret_cast<sockaddr*>(&own), &length) == 0 &&
            length == listener.length && std::memcmp(&own, &listener.address, length) == 0 &&
            NothingQueued(fd))
          ::close(fd);
      },
      &name);
}

}  // namespace

bool ListenerImpl::StartServing(std::string* error) {
  stop_fd.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!stop_fd) {
    *error = fmt::format("listener {}: eventfd: {}", address.display, ErrnoText(errno));
    return false;
  }
  context.secret = options.secret;
  context.uid = ::geteuid();
  context.timeout = options.timeout;
  context.stop_fd = stop_fd.get();
  context.handler = &handler;
  context.name = address.display;
  context.events = options.events;
  context.watchers = options.keep_watchers ? &watchers : nullptr;
  watchers.SetResumeFdSource(options.resume_fd);
  // At least one worker: with none, a posted task or a long reply would
  // wait for ever; a negative count would read as no bound at all.
  if (options.max_workers < 1) {
    VMMIPC_LOG_WARN("listener {}: max_workers {} is not a worker count; using 1 worker",
                    address.display, options.max_workers);
  }
  workers.Configure(&context, std::max(options.max_workers, 1));
  // Room for every connection the caps let wait, so that the poll thread
  // never allocates for one.
  admission.waiting.reserve(kMaxOwnWaiting + kMaxOthersWaiting);
  admission.kept.reserve(kMaxKeptConnections);  // Keep never allocates on the poll thread
  admission.MeasureBudget(false);
  const ConnectionCaps& caps = admission.budget.caps();
  VMMIPC_LOG_DEBUG(
      "listener {}: {} of {} fds free: at most {} connections of our uid and {} of other users "
      "({} per user) waiting for their request, {} watch connections, {} kept for an importer's "
      "next request",
      address.display, admission.budget.free_fds(), admission.budget.limit(), caps.own_waiting,
      caps.others_waiting, caps.per_other_uid, caps.watchers, caps.kept);
  try {
    thread = StartQuietThread("vmmipc-listen", [this] { Run(); });
  } catch (const std::exception& e) {
    *error = fmt::format("listener {}: cannot start the thread: {}", address.display, e.what());
    return false;
  }
  return true;
}

void ListenerImpl::Stop() noexcept {
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
  // The stop fd is readable by now (when there was a thread to stop):
  // workers in the middle of a reply give up at once.
  workers.Stop();
  listen_fd.Reset();
  stop_fd.Reset();
  // Only the file this listener bound: if someone replaced it meanwhile, it is theirs.
  socket_file.Remove();
}

void ListenerImpl::Abandon() noexcept {
  Park(thread.release());  // leaked on purpose, see `thread`
  // Closing our copies leaves the parent's sockets, chunks and eventfd
  // untouched: they are the same open files, still referenced by the
  // parent's descriptors. The queued replies' and the watch connections'
  // under their fork locks; then every other accepted connection, by name.
  workers.AbandonAfterFork();
  watchers.AbandonAfterFork();
  CloseAcceptedCopies(listen_fd.get());
  // Closed above: their numbers are forgotten, never closed again (the
  // lists may have been mid-update at the fork; forgetting is safe anyway).
  for (Connection& c : admission.waiting) (void)c.fd.Release();
  for (Connection& c : admission.kept) (void)c.fd.Release();
  listen_fd.Reset();
  stop_fd.Reset();
  socket_file.Forget();  // the path belongs to the parent's listener
}

std::unique_ptr<Listener> Listener::Start(const ListenerOptions& options, ServeHandler handler,
                                          std::string* error) {
  std::string local_error;
  if (error == nullptr) error = &local_error;
  try {
    auto impl = std::make_unique<ListenerImpl>();
    impl->options = options;
    impl->handler = std::move(handler);
    impl->owner_pid = ::getpid();
    if (!impl->handler) {
      *error = "listener: no handler";
      return nullptr;
    }
    // In a user namespace without a uid mapping this process is the overflow
    // uid, and so, to SO_PEERCRED, is every other user's process: the uid
    // check could not tell our importers from anyone else's. Not served at
    // all (one clear line from the caller), rather than served to everyone.
    if (const uint32_t uid = ::geteuid(); IsOverflowUid(uid)) {
      *error = fmt::format(
          "this process runs as the overflow uid {} (a user namespace without a uid mapping, "
          "such as `unshare --user`), as every other user's process does to it: it cannot "
          "tell its own importers from another user's, so it does not serve; map the "
          "namespace's uid (--map-root-user, or a container runtime's user mapping)",
          uid);
      return nullptr;
    }
    const SocketOwner owner = options.instance != 0 ? SocketOwner::Instance(options.instance)
                                                    : SocketOwner::Pid(options.pid);
    if (!MakeSocketAddress(::geteuid(), owner, options.socket_dir, &impl->address, error)) {
      return nullptr;
    }
    // On any failure from here, ~Impl (Stop) closes what was made and
    // removes a socket file this start bound.
    if (!BindListeningSocket(impl->address, &impl->listen_fd, &impl->socket_file, error) ||
        !impl->StartServing(error)) {
      return nullptr;
    }
    VMMIPC_LOG_DEBUG("listener {}: serving", impl->address.display);
    return std::unique_ptr<Listener>(new Listener(std::move(impl)));
  } catch (const std::exception& e) {
    *error = fmt::format("listener: {}", e.what());
    return nullptr;
  }
}

Listener::Listener(std::unique_ptr<ListenerImpl> impl) : impl_(std::move(impl)) {}

Listener::~Listener() = default;  // ~Impl stops the thread

void Listener::Post(std::function<void()> task) {
  if (impl_ && task)
    impl_->workers.Dispatch(ListenerJob{PendingRequest{}, ServeReply{}, std::move(task)});
}

NotifyResult Listener::Notify(const std::vector<WatchNotice>& notices, Timeout timeout) {
  if (!impl_ || impl_->context.watchers == nullptr) {
    NotifyResult none;
    none.done.resize(notices.size());
    return none;
  }
  return impl_->watchers.Notify(notices, timeout.ms(), impl_->stop_fd.get());
}

size_t Listener::Announce(const WatchAnnounce& announce) noexcept {
  if (!impl_ || impl_->context.watchers == nullptr) return 0;
  return impl_->watchers.Announce(announce);
}

void Listener::PrepareFork() noexcept {
  if (!impl_) return;
  impl_->watchers.PrepareFork();
  impl_->workers.PrepareFork();
}

void Listener::ParentAfterFork() noexcept {
  if (!impl_) return;
  impl_->workers.ParentAfterFork();
  impl_->watchers.ParentAfterFork();
}

void Listener::AbandonAfterFork() noexcept {
  if (impl_) impl_->Abandon();
}

const std::string& Listener::address() const { return impl_->address.display; }

}  // namespace vmmipc::transport
