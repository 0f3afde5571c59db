// The listener's poll thread: one poll over the stop fd, the listening
// socket, the connections waiting for their request and the watch
// connections; the requests that came are read and answered (here when the
// reply is one message, else by a worker), silent connections dropped at
// their deadline, and new connections accepted, a turn's worth at a time,
// and read at once. Never blocks on a peer.
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>

#include "common/log.h"
#include "common/log_limit.h"
#include "common/syscall.h"
#include "transport/reaper/fd_reaper.h"
#include "transport/serve/listener/listener_impl.h"

namespace vmmipc::transport {
namespace {

// The poll loop's longest sleep: a safety net only, since Stop() wakes the
// thread through the eventfd at once and request deadlines shorten it.
constexpr int kPollPeriodMs = 200;
// How long accept() rests when it fails for lack of fds or memory: the
// pending connection stays queued, so retrying at once would spin. The
// waiting connections are read meanwhile (their answers free fds).
constexpr int kAcceptBackoffMs = 100;
// Accepts per turn of the poll loop at most: a flood of connections (each
// closed at once past its class's cap) must not keep the thread from the
// waiting connections' requests and deadlines, nor the watch connections.
constexpr int kAcceptsPerTurn = 64;

// "accept failed" lines: the first 3 of each minute, then one line with how
// many more there were. Out of fds the listener retries ten times a second
// for as long as it lasts, and the host's stderr is not ours to fill.
constinit log::LineLimit g_accept_lines(3, 60000);

}  // namespace

void ListenerImpl::Run() noexcept {
  // The stop fd and the listening socket first, always there: room for
  // them, and for every fd the caps let the loop poll, is made here once, so
  // that the loop does not allocate for its poll set.
  std::array<pollfd, 2> fixed{};
  std::vector<pollfd> pfds;
  try {
    pfds.reserve(2 + kMaxOwnWaiting + kMaxOthersWaiting + kMaxKeptConnections +
                 kMaxWatchConnections);
  } catch (...) {
    // Each turn tries again below.
  }
  while (true) {
    const bool accepting = admission.accept_resume.Expired();
    fixed[0] = {stop_fd.get(), POLLIN, 0};
    fixed[1] = {accepting ? listen_fd.get() : -1, POLLIN, 0};
    int sleep_ms =
        accepting ? kPollPeriodMs : std::min(kPollPeriodMs, admission.accept_resume.RemainingMs());
    for (const Connection& c : admission.waiting)
      sleep_ms = std::min(sleep_ms, c.deadline.RemainingMs());
    size_t kept_fds = 0;
    size_t watch_fds = 0;
    const bool complete = BuildPollSet(fixed, &pfds, &kept_fds, &watch_fds);
    pollfd* set = complete ? pfds.data() : fixed.data();
    const size_t count = complete ? pfds.size() : fixed.size();
    const int n = ::poll(set, count, sleep_ms);
    if (n < 0 && errno != EINTR) {
      VMMIPC_LOG_ERROR("listener {}: poll failed: {}; stopping", address.display, ErrnoText(errno));
      break;
    }
    if (set[0].revents != 0) break;
    // Watch connections that hung up go; lagging followers that answer again
    // get what they missed (watchers.h); at least once a poll period,
    // without waiting on anyone.
    if (context.watchers != nullptr && complete) {
      context.watchers->Maintain(std::span<const pollfd>(pfds).subspan(watch_fds));
      // Full: perhaps the host has closed fds since the cap was set.
      if (context.watchers->count() >= admission.budget.caps().watchers) admission.RefreshBudget();
    }
    // Requests first (their peers are waiting), then the deadlines, then new
    // peers. The kept connections' first: those are our importers' next
    // opens, and a request read from them may bring a connection back to kept.
    const std::span<const pollfd> kept_polled =
        complete ? std::span<const pollfd>(pfds).subspan(kept_fds, admission.kept.size())
                 : std::span<const pollfd>();
    ReadKept(kept_polled, n > 0 && complete);
    ReadWaiting(pfds, n > 0 && complete);
    if (n > 0 && accepting && set[1].revents != 0) AcceptQueued();
  }
  for (Connection& c : admission.waiting) CloseConnection(std::move(c.fd));
  admission.waiting.clear();
  for (Connection& c : admission.kept) CloseConnection(std::move(c.fd));
  admission.kept.clear();
}

// One turn's poll set: `fixed` (the stop fd, the listening socket), the
// waiting connections, the kept ones (from `*kept_fds`), then every watch
// connection (from `*watch_fds`), for its hang-up, and lagging followers,
// whose answers and room bring Maintain back at once. False when there was
// no memory for it (a noexcept thread: a throw would end the process): the
// turn then waits on `fixed` only and drops what is past its deadline; the
// next tries again, a poll period at most later.
bool ListenerImpl::BuildPollSet(const std::array<pollfd, 2>& fixed, std::vector<pollfd>* pfds,
                                size_t* kept_fds, size_t* watch_fds) noexcept {
  try {
    pfds->assign(fixed.begin(), fixed.end());
    for (const Connection& c : admission.waiting) pfds->push_back({c.fd.get(), POLLIN, 0});
    *kept_fds = pfds->size();
    for (const Connection& c : admission.kept) pfds->push_back({c.fd.get(), POLLIN, 0});
    *watch_fds = pfds->size();
    if (context.watchers != nullptr) context.watchers->PollFds(pfds);
    return true;
  } catch (...) {
    return false;
  }
}

// Reads the request of `c`, which poll said is readable, and answers it;
// true when the connection has left `c` (answered, refused or dropped).
bool ListenerImpl::ReadAndAnswer(Connection& c) noexcept {
  PendingRequest request;
  const ReadOutcome outcome = ReadRequest(c, context, &request);
  if (outcome == ReadOutcome::kReady) Answer(std::move(request));
  return outcome != ReadOutcome::kWaiting;
}

// Reads the requests that came on the kept connections polled (`pfds`, one
// per connection, in order) and closes those whose importer hung up or that
// idled past their bound, keeping the rest in order, in place. An answer may
// keep its connection again: Keep appends it past the polled ones, within
// the capacity reserved at Start, and it joins the kept ones at the end.
void ListenerImpl::ReadKept(std::span<const pollfd> pfds, bool polled) noexcept {
  std::vector<Connection>& kept = admission.kept;
  const size_t count = std::min(kept.size(), pfds.size());
  size_t still = 0;
  for (size_t i = 0; i < count; ++i) {
    Connection& c = kept[i];
    if (polled && pfds[i].revents != 0 && ReadAndAnswer(c)) continue;
    if (c.deadline.Expired()) {
      CloseKept(std::move(c), context);
      continue;
    }
    if (still != i) kept[still] = std::move(kept[i]);
    ++still;
  }
  // Those kept again during the loop, down after the ones still kept.
  for (size_t i = count; i < kept.size(); ++i) {
    if (still != i) kept[still] = std::move(kept[i]);
    ++still;
  }
  kept.erase(kept.begin() + static_cast<ptrdiff_t>(still), kept.end());
}

// Reads the requests that came (`polled`: the poll said which) and drops the
// connections whose deadline passed, keeping the rest in order, in place.
void ListenerImpl::ReadWaiting(const std::vector<pollfd>& pfds, bool polled) noexcept {
  size_t kept = 0;
  admission.own_waiting = admission.others_waiting = 0;
  for (size_t i = 0; i < admission.waiting.size(); ++i) {
    Connection& c = admission.waiting[i];
    if (polled && pfds[i + 2].revents != 0 && ReadAndAnswer(c)) continue;
    if (c.deadline.Expired()) {
      DropSilent(std::move(c), context);
      continue;
    }
    ++(c.peer.uid == context.uid ? admission.own_waiting : admission.others_waiting);
    if (kept != i) admission.waiting[kept] = std::move(c);
    ++kept;
  }
  admission.waiting.erase(admission.waiting.begin() + static_cast<ptrdiff_t>(kept),
                          admission.waiting.end());
}

// Accepts what is queued, a turn's worth at most. Non-blocking: a connection
// that went away between poll and accept must not park the thread where
// Stop() cannot reach it.
void ListenerImpl::AcceptQueued() noexcept {
  // The reaper keeps open what it cannot take, and has kept the most
  // (fd_reaper.h): a connection may carry a peer's fds (before Linux 6.16),
  // so none is taken until it takes again; they wait in the backlog.
  if (!ReaperCanKeepMore()) {
    admission.accept_resume = Deadline::AfterMs(kAcceptBackoffMs);
    return;
  }
  for (int i = 0; i < kAcceptsPerTurn; ++i) {
    const int fd = ::accept4(listen_fd.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      const int error = errno;
      if (error != EAGAIN && error != EINTR && error != ECONNABORTED) AcceptFailed(error);
      return;
    }
    if (admission.out_of_fds) {
      // The shortage is over (or easing): without a new look, the caps would
      // stay at what was free during it for up to a second.
      admission.out_of_fds = false;
      admission.MeasureBudget(false);
    } else if (admission.budget.Outgrown(fd, admission.Held())) {
      admission.RefreshBudget();
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
        admission.Admit(std::move(connection));
        break;
    }
  }
}

void ListenerImpl::AcceptFailed(int error) noexcept {
  admission.accept_resume = Deadline::AfterMs(kAcceptBackoffMs);
  // Out of fds (EMFILE: this process's; ENFILE: the system's): the host has
  // fewer free than the caps were set for.
  if (error == EMFILE || error == ENFILE) {
    admission.MeasureBudget(error == EMFILE);
    admission.out_of_fds = true;
  }
  if (log::Admitted(g_accept_lines, log::Level::kWarn, "listener " + address.display,
                    "accept failures"))
    VMMIPC_LOG_WARN(
        "listener {}: accept failed: {}; retrying in {} ms (this process holds {} connections "
        "waiting for their request and {} watch connections)",
        address.display, ErrnoText(error), kAcceptBackoffMs, admission.waiting.size(),
        context.watchers != nullptr ? context.watchers->count() : 0);
}

// Answers on the poll thread: the handler here (one export per chunk at
// most, or a dup), and the reply too when it is one message, which a fresh
// connection's socket buffer always takes at once. A handoff to a worker
// would add a thread wake-up to every open
// (docs/driver-behaviour.md#thread-hand-off). Longer replies are sent by a
// worker, since their sends may wait on a peer that does not read.
// The connection is then kept for the importer's next request, where the
// budget allows (Keep); a worker's closes it (its importer connects again).
// A reply waits for a worker with its connection and chunk fds, within the
// queue's share of the fds (Admission::MayQueue); past it the request is
// refused kInternal ("busy"), its fds closed at once.
void ListenerImpl::Answer(PendingRequest request) noexcept {
  ServeReply reply;
  if (!PrepareReply(request, context, &reply)) return;
  if (ReplyFitsOneMessage(reply)) {
    const PeerCredentials peer = request.peer;
    admission.Keep(SendReplyKeeping(std::move(request), reply, context), peer);
    return;
  }
  if (std::string why; !admission.MayQueue(reply.chunks.size() + 1, &why)) {
    reply = ServeReply{};  // its fds closed before the refusal goes
    RefuseRequest(std::move(request), RefuseReason::kInternal, why, context);
    return;
  }
  workers.Dispatch(ListenerJob{std::move(request), std::move(reply), nullptr});
}

}  // namespace vmmipc::transport
