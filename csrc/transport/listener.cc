// The listener's lifecycle: bind the socket (abstract or filesystem, whose
// file goes at stop and at exit: socket_file.h), run the poll thread that
// accepts connections, as many as the host's fds allow each class of peers
// (fd_budget.h), and reads requests, run the workers that answer them, stop
// everything promptly through an eventfd, and let a forked child walk away
// from threads it does not have. What happens on one connection is
// serve_connection.cc's job.
#include "transport/listener.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "common/log.h"
#include "common/log_limit.h"
#include "common/parked.h"
#include "common/quiet_thread.h"
#include "common/syscall.h"
#include "transport/fd_budget.h"
#include "transport/fd_channel.h"
#include "transport/serve_connection.h"
#include "transport/socket_address.h"
#include "transport/socket_file.h"
#include "transport/wire.h"

namespace vmmipc::transport {
namespace {

// The poll loop's longest sleep: a safety net only, since Stop() wakes the
// thread through the eventfd at once and request deadlines shorten it.
constexpr int kPollPeriodMs = 200;
// How long accept() rests when it fails for lack of fds or memory: the
// pending connection stays queued, so retrying at once would spin. The
// waiting connections are read meanwhile (their answers free fds).
constexpr int kAcceptBackoffMs = 100;
constexpr int kBacklog = 256;
// Accepts per turn of the poll loop at most: a flood of connections (each
// closed at once past its class's cap) must not keep the thread from the
// waiting connections' requests and deadlines, nor the watch connections.
constexpr int kAcceptsPerTurn = 64;

// "accept failed" lines: the first 3 of each minute, then one line with how
// many more there were. Out of fds the listener retries ten times a second
// for as long as it lasts, and the host's stderr is not ours to fill.
constinit log::LineLimit g_accept_lines(3, 60000);

}  // namespace

struct Listener::Impl {
  ListenerOptions options;
  ServeHandler handler;
  ServeContext context;  // shared by the poll thread and the workers; set before they start
  Watchers watchers;     // kept watch connections (options.keep_watchers)
  SocketAddress address;
  ScopedFd listen_fd;
  ScopedFd stop_fd;  // eventfd: readable once Stop() wrote it, and stays so
  // Heap-held so that a forked child can leak them: destroying a joinable
  // std::thread calls std::terminate, and joining a thread that does not
  // exist in the child would hang.
  std::unique_ptr<std::thread> thread;
  // The poll thread's: connections accepted whose request is not read yet,
  // how many of them are our uid's and other uids', what the host's fds
  // allow of each class (fd_budget.h), until when accept() rests, and
  // whether it ran out of fds last time (the caps were cut to what was free
  // then: the first accept that works again measures afresh).
  std::vector<Connection> waiting;
  size_t own_waiting = 0;
  size_t others_waiting = 0;
  FdBudget budget;
  Deadline accept_resume = Deadline::AfterMs(0);
  bool out_of_fds = false;
  pid_t owner_pid = 0;          // getpid() at Start(): who may join the threads and unlink the path
  BoundSocketFile socket_file;  // a filesystem socket's file: removed at Stop() and at exit

  // The workers. Guarded by jobs_mutex: jobs, workers, idle_workers,
  // stopping. Never held across I/O or the handler.
  struct Job {
    PendingRequest request;
    ServeReply reply;            // prepared on the poll thread: only to be sent
    std::function<void()> task;  // set instead of a request for Post()
  };
  std::mutex jobs_mutex;
  std::condition_variable jobs_ready;
  std::deque<Job> jobs;
  std::vector<std::unique_ptr<std::thread>> workers;
  size_t idle_workers = 0;
  bool stopping = false;

  // Every exit path of Start() and of the Listener ends here.
  ~Impl() { Stop(); }

  void Run() noexcept;
  void ReadWaiting(const std::vector<pollfd>& pfds, bool polled) noexcept;
  void AcceptQueued() noexcept;
  void AcceptFailed(int error) noexcept;
  void Admit(Connection connection) noexcept;
  std::string OverCap(uint32_t uid) const;
  size_t Held() const noexcept;
  void MeasureBudget(bool out_of_fds) noexcept;
  bool RefreshBudget() noexcept;
  void Work() noexcept;
  void Dispatch(Job job) noexcept;
  void Answer(PendingRequest request) noexcept;
  void Stop() noexcept;
  void Abandon() noexcept;
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
  std::vector<pollfd> pfds;
  while (true) {
    pfds.clear();
    const bool accepting = accept_resume.Expired();
    pfds.push_back({stop_fd.get(), POLLIN, 0});
    pfds.push_back({accepting ? listen_fd.get() : -1, POLLIN, 0});
    int sleep_ms = accepting ? kPollPeriodMs : std::min(kPollPeriodMs, accept_resume.RemainingMs());
    for (const Connection& c : waiting) {
      pfds.push_back({c.fd.get(), POLLIN, 0});
      sleep_ms = std::min(sleep_ms, c.deadline.RemainingMs());
    }
    // After the waiting connections (their indexes above stay): every watch
    // connection, for its hang-up, and lagging followers, whose answers and
    // room bring Maintain back at once.
    const size_t watch_fds = pfds.size();
    if (context.watchers != nullptr) context.watchers->PollFds(&pfds);
    const int n = ::poll(pfds.data(), pfds.size(), sleep_ms);
    if (n < 0 && errno != EINTR) {
      VMMIPC_LOG_ERROR("listener {}: poll failed: {}; stopping", address.display, ErrnoText(errno));
      break;
    }
    if (pfds[0].revents != 0) break;
    // Watch connections that hung up go; lagging followers that answer again
    // get what they missed (watchers.h); at least once a poll period,
    // without waiting on anyone.
    if (context.watchers != nullptr) {
      context.watchers->Maintain(std::span<const pollfd>(pfds).subspan(watch_fds));
      // Full: perhaps the host has closed fds since the cap was set.
      if (context.watchers->count() >= budget.caps().watchers) RefreshBudget();
    }
    // Requests first (their peers are waiting), then the deadlines, then new peers.
    ReadWaiting(pfds, n > 0);
    if (n > 0 && accepting && pfds[1].revents != 0) AcceptQueued();
  }
  for (Connection& c : waiting) CloseConnection(std::move(c.fd));
  waiting.clear();
}

// Reads the requests that came (`polled`: the poll said which) and drops the
// connections whose deadline passed, keeping the rest in order, in place.
void Listener::Impl::ReadWaiting(const std::vector<pollfd>& pfds, bool polled) noexcept {
  size_t kept = 0;
  own_waiting = others_waiting = 0;
  for (size_t i = 0; i < waiting.size(); ++i) {
    Connection& c = waiting[i];
    if (polled && pfds[i + 2].revents != 0) {
      PendingRequest request;
      const ReadOutcome outcome = ReadRequest(c, context, &request);
      if (outcome == ReadOutcome::kReady) {
        Answer(std::move(request));
        continue;
      }
      if (outcome == ReadOutcome::kDone) continue;
    }
    if (c.deadline.Expired()) {
      DropSilent(std::move(c), context);
      continue;
    }
    ++(c.peer.uid == context.uid ? own_waiting : others_waiting);
    if (kept != i) waiting[kept] = std::move(c);
    ++kept;
  }
  waiting.erase(waiting.begin() + static_cast<ptrdiff_t>(kept), waiting.end());
}

// Accepts what is queued, a turn's worth at most. Non-blocking: a connection
// that went away between poll and accept must not park the thread where
// Stop() cannot reach it.
void Listener::Impl::AcceptQueued() noexcept {
  for (int i = 0; i < kAcceptsPerTurn; ++i) {
    const int fd = ::accept4(listen_fd.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      const int error = errno;
      if (error != EAGAIN && error != EINTR && error != ECONNABORTED) AcceptFailed(error);
      return;
    }
    if (out_of_fds) {
      // The shortage is over (or easing): without a new look, the caps would
      // stay at what was free during it for up to a second.
      out_of_fds = false;
      MeasureBudget(false);
    } else if (budget.Outgrown(fd, Held())) {
      RefreshBudget();
    }
    Connection connection;
    if (!StartConnection(ScopedFd(fd), context, &connection)) continue;
    // The importer sends its request right after connecting: it is often
    // queued already, and reading it now saves a poll round (and answers a
    // peer even when its class has no room left to wait).
    PendingRequest request;
    switch (ReadRequest(connection, context, &request)) {
      case ReadOutcome::kReady:
        Answer(std::move(request));
        break;
      case ReadOutcome::kDone:
        break;
      case ReadOutcome::kWaiting:
        Admit(std::move(connection));
        break;
    }
  }
}

void Listener::Impl::AcceptFailed(int error) noexcept {
  accept_resume = Deadline::AfterMs(kAcceptBackoffMs);
  // Out of fds (EMFILE: this process's; ENFILE: the system's): the host has
  // fewer free than the caps were set for.
  if (error == EMFILE || error == ENFILE) {
    MeasureBudget(error == EMFILE);
    out_of_fds = true;
  }
  if (log::Admitted(g_accept_lines, log::Level::kWarn, "listener " + address.display,
                    "accept failures"))
    VMMIPC_LOG_WARN(
        "listener {}: accept failed: {}; retrying in {} ms (this process holds {} connections "
        "waiting for their request and {} watch connections)",
        address.display, ErrnoText(error), kAcceptBackoffMs, waiting.size(),
        context.watchers != nullptr ? context.watchers->count() : 0);
}

// A connection that must wait for its request, if its class has room; the
// newest of a full class is closed at once. Our uid's and other uids' are
// counted apart, so that another user never takes our importers' room.
void Listener::Impl::Admit(Connection connection) noexcept {
  try {
    std::string why = OverCap(connection.peer.uid);
    // Full: perhaps the host has closed fds since the caps were set.
    if (!why.empty() && RefreshBudget()) why = OverCap(connection.peer.uid);
    if (!why.empty()) {
      DropOverCap(std::move(connection), context, why);
      return;
    }
    // Never grows past the capacity reserved at Start: the caps are below it.
    ++(connection.peer.uid == context.uid ? own_waiting : others_waiting);
    waiting.push_back(std::move(connection));
  } catch (...) {
    CloseConnection(std::move(connection.fd));
  }
}

// Empty when a connection of `uid` may wait; else why not, for the log line.
std::string Listener::Impl::OverCap(uint32_t uid) const {
  const ConnectionCaps& caps = budget.caps();
  if (uid == context.uid) {
    if (own_waiting < caps.own_waiting) return {};
    return fmt::format(
        "{} connections of this uid wait for their request already, the most while {} of "
        "this process's {} fds are free",
        own_waiting, budget.free_fds(), budget.limit());
  }
  if (others_waiting >= caps.others_waiting)
    return fmt::format("{} connections of other users wait already (at most {} together)",
                       others_waiting, caps.others_waiting);
  const size_t of_uid = static_cast<size_t>(std::count_if(
      waiting.begin(), waiting.end(), [uid](const Connection& c) { return c.peer.uid == uid; }));
  if (of_uid >= caps.per_other_uid)
    return fmt::format("{} connections of uid {} wait already (at most {} per other user)", of_uid,
                       uid, caps.per_other_uid);
  return {};
}

// The connections the listener holds: waiting ones and watch connections.
size_t Listener::Impl::Held() const noexcept {
  return waiting.size() + (context.watchers != nullptr ? context.watchers->count() : 0);
}

void Listener::Impl::MeasureBudget(bool out_of_fds) noexcept {
  budget.Measure(Held(), out_of_fds);
  watchers.SetMaxWatchers(budget.caps().watchers);
}

bool Listener::Impl::RefreshBudget() noexcept {
  if (!budget.Refresh(Held())) return false;
  watchers.SetMaxWatchers(budget.caps().watchers);
  return true;
}

// Answers on the poll thread: the handler here (one export per chunk at
// most, ~35 us, or a dup), and the reply too when it is one message, which a
// fresh connection's socket buffer always takes at once. A handoff to a
// worker would add a thread wake-up to every open (measured on the H200:
// ~80 us per open). Longer replies are sent by a worker, since their sends
// may wait on a peer that does not read.
void Listener::Impl::Answer(PendingRequest request) noexcept {
  ServeReply reply;
  if (!PrepareReply(request, context, &reply)) return;
  if (ReplyFitsOneMessage(reply)) {
    SendReply(std::move(request), std::move(reply), context);
    return;
  }
  Dispatch(Job{std::move(request), std::move(reply), nullptr});
}

void Listener::Impl::Dispatch(Job job) noexcept {
  try {
    std::unique_lock lock(jobs_mutex);
    if (stopping) return;  // the job's connection closes with it
    jobs.push_back(std::move(job));
    if (idle_workers == 0 && workers.size() < static_cast<size_t>(options.max_workers)) {
      try {
        workers.push_back(StartQuietThread("vmmipc-serve", [this] { Work(); }));
      } catch (const std::exception& e) {
        if (workers.empty()) {
          VMMIPC_LOG_ERROR(
              "listener {}: cannot start a worker thread: {}; sending on the "
              "poll thread",
              address.display, e.what());
          Job inline_job = std::move(jobs.back());
          jobs.pop_back();
          lock.unlock();
          if (inline_job.task)
            inline_job.task();
          else
            SendReply(std::move(inline_job.request), std::move(inline_job.reply), context);
          return;
        }
      }
    }
    lock.unlock();
    jobs_ready.notify_one();
  } catch (...) {
    // Out of memory queueing the job: it is dropped, its connection closed.
  }
}

void Listener::Impl::Work() noexcept {
  std::unique_lock lock(jobs_mutex);
  while (true) {
    ++idle_workers;
    jobs_ready.wait(lock, [this] { return stopping || !jobs.empty(); });
    --idle_workers;
    if (stopping) return;
    Job job = std::move(jobs.front());
    jobs.pop_front();
    lock.unlock();
    if (job.task) {
      try {
        job.task();
      } catch (...) {
        VMMIPC_LOG_ERROR("listener {}: a posted task threw", address.display);
      }
    } else {
      SendReply(std::move(job.request), std::move(job.reply), context);
    }
    lock.lock();
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
  std::deque<Job> abandoned;
  {
    std::lock_guard lock(jobs_mutex);
    stopping = true;
    abandoned.swap(jobs);
  }
  jobs_ready.notify_all();
  // Workers in the middle of a reply see the stop fd and give up at once.
  for (auto& worker : workers)
    if (worker->joinable()) worker->join();
  workers.clear();
  for (Job& job : abandoned) CloseConnection(std::move(job.request.fd));
  listen_fd.Reset();
  stop_fd.Reset();
  // Only the file this listener bound: if someone replaced it meanwhile, it is theirs.
  socket_file.Remove();
}

void Listener::Impl::Abandon() noexcept {
  Park(thread.release());  // leaked on purpose, see `thread`
  // The workers vector's storage and its mutex may be in any state the
  // parent's threads left them in: never touched again, only kept reachable.
  for (auto& worker : workers) Park(worker.release());
  // Closing our copies leaves the parent's socket and eventfd untouched: they
  // are the same open files, still referenced by the parent's descriptors.
  watchers.AbandonAfterFork();
  listen_fd.Reset();
  stop_fd.Reset();
  socket_file.Forget();  // the path belongs to the parent's listener
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
    // From here the file is removed at Stop() (this function's failures
    // included) and at the process's exit, while it is still the one bound.
    if (!address.abstract && !impl->socket_file.Adopt(address.path))
      VMMIPC_LOG_WARN(
          "listener {}: the socket file is not the one bind() made any more; it is left "
          "alone, at stop and at exit",
          address.display);
    // Nothing we are sent may carry fds: have the kernel refuse them outright
    // where it can (Linux 6.16+); elsewhere serve_connection never takes them.
    const bool refuses_fds = RefuseIncomingFds(impl->listen_fd.get());
    VMMIPC_LOG_DEBUG("listener {}: SO_PASSRIGHTS {}", address.display,
                     refuses_fds ? "off: the kernel refuses fds sent to us" : "not supported");
    if (::listen(impl->listen_fd.get(), kBacklog) != 0) {
      *error = fmt::format("listener {}: listen: {}", address.display, ErrnoText(errno));
      return nullptr;
    }
    impl->stop_fd.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!impl->stop_fd) {
      *error = fmt::format("listener {}: eventfd: {}", address.display, ErrnoText(errno));
      return nullptr;
    }

    impl->context.secret = options.secret;
    impl->context.uid = ::geteuid();
    impl->context.timeout_ms = std::max(options.timeout_ms, 1);
    impl->context.stop_fd = impl->stop_fd.get();
    impl->context.handler = &impl->handler;
    impl->context.name = address.display;
    impl->context.events = options.events;
    impl->context.watchers = options.keep_watchers ? &impl->watchers : nullptr;
    impl->watchers.SetResumeFdSource(options.resume_fd);
    // Room for every connection the caps let wait, so that the poll thread
    // never allocates for one.
    impl->waiting.reserve(kMaxOwnWaiting + kMaxOthersWaiting);
    impl->MeasureBudget(false);
    const ConnectionCaps& caps = impl->budget.caps();
    VMMIPC_LOG_DEBUG(
        "listener {}: {} of {} fds free: at most {} connections of our uid and {} of other users "
        "({} per user) waiting for their request, {} watch connections",
        address.display, impl->budget.free_fds(), impl->budget.limit(), caps.own_waiting,
        caps.others_waiting, caps.per_other_uid, caps.watchers);
    try {
      Impl* raw = impl.get();
      impl->thread = StartQuietThread("vmmipc-listen", [raw] { raw->Run(); });
    } catch (const std::exception& e) {
      *error = fmt::format("listener {}: cannot start the thread: {}", address.display, e.what());
      return nullptr;
    }
    VMMIPC_LOG_DEBUG("listener {}: serving", address.display);
    return std::unique_ptr<Listener>(new Listener(std::move(impl)));
  } catch (const std::exception& e) {
    *error = fmt::format("listener: {}", e.what());
    return nullptr;
  }
}

Listener::Listener(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Listener::~Listener() = default;  // ~Impl stops the thread

void Listener::Post(std::function<void()> task) {
  if (impl_ && task) impl_->Dispatch(Impl::Job{PendingRequest{}, ServeReply{}, std::move(task)});
}

NotifyResult Listener::Notify(const std::vector<WatchNotice>& notices, int timeout_ms) {
  if (!impl_ || impl_->context.watchers == nullptr) {
    NotifyResult none;
    none.done.resize(notices.size());
    return none;
  }
  return impl_->watchers.Notify(notices, timeout_ms, impl_->stop_fd.get());
}

void Listener::PrepareFork() noexcept {
  if (impl_) impl_->watchers.PrepareFork();
}

void Listener::ParentAfterFork() noexcept {
  if (impl_) impl_->watchers.ParentAfterFork();
}

void Listener::AbandonAfterFork() noexcept {
  if (impl_) impl_->Abandon();
}

const std::string& Listener::address() const { return impl_->address.display; }

}  // namespace vmmipc::transport
