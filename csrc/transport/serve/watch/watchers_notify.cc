// A Notify: every notice to the watchers of its followers, sent and acked on
// all of them at once within one deadline; whoever is not done by then lags
// (watchers_catch_up.cc). The primitives it uses, one event sent and the
// acks read, are the Watcher's (watcher.cc).
#include <poll.h>

#include <algorithm>
#include <cerrno>

#include "common/log.h"
#include "transport/serve/watch/watchers.h"

namespace vmmipc::transport {
namespace {

bool Contains(const std::vector<uint32_t>& ids, uint32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

}  // namespace

// One watcher's part in a Notify: the notices for it, in order, and how
// many of them were sent.
struct Watchers::Target {
  std::shared_ptr<Watcher> watcher;
  std::vector<size_t> notices;  // indexes into the call's notices
  size_t next = 0;              // the first not sent yet
  bool WaitsForAck() const {
    return std::any_of(watcher->outstanding.begin(), watcher->outstanding.end(),
                       [](const auto& o) { return o.second >= 0; });
  }
};

std::vector<Watchers::Target> Watchers::TargetsOf(const std::vector<WatchNotice>& notices,
                                                  const Deadline& deadline) {
  std::vector<Target> targets;
  std::unique_lock<ForkMutex> lock(list_mutex_);
  for (const auto& watcher : list_) {
    Target target{watcher, {}, 0};
    for (size_t i = 0; i < notices.size(); ++i)
      if (Contains(notices[i].followers, watcher->follower)) target.notices.push_back(i);
    if (!target.notices.empty()) targets.push_back(std::move(target));
  }
  // A watcher whose reply is still being sent: its events go after the
  // reply (the same connection), so wait for it, within the one deadline;
  // not for one that lags (its reply was stuck before: it costs a burst one
  // wait, not one per Notify).
  auto replying = [&] {
    return std::any_of(targets.begin(), targets.end(), [](const Target& t) {
      return t.watcher->state == Watcher::State::kReplying && !t.watcher->lagging;
    });
  };
  while (replying() && !deadline.Expired())
    activated_.wait_for(lock, std::chrono::milliseconds(deadline.RemainingMs()));
  return targets;
}

bool Watchers::LaggedThisBurst(const Watcher& watcher) const {
  return watcher.lag_burst == burst_ && std::chrono::steady_clock::now() < burst_over_at_;
}

void Watchers::Lag(Target& target, const std::vector<WatchNotice>& notices, LagCause cause,
                   NotifyResult* result) {
  Watcher& watcher = *target.watcher;
  const bool newly = cause != LagCause::kStillLagging;
  if (newly) watcher.lag_sequence = watcher.sequence;
  if (!watcher.lagging) watcher.lagging = true;
  // Lags for the rest of this burst, and so do the other followers of its
  // process (watchers.h). Pid 0 is every process of another pid namespace.
  watcher.lag_burst = burst_;
  if (watcher.pid != 0 && !Contains(burst_lagging_pids_, watcher.pid))
    burst_lagging_pids_.push_back(watcher.pid);
  for (size_t k = target.next; k < target.notices.size() && !watcher.overflowed; ++k) {
    const WatchNotice& notice = notices[target.notices[k]];
    if (watcher.backlog.size() >= max_backlog_ && watcher.backlog.count(notice.base) == 0) {
      watcher.overflowed = true;  // told to drop everything when it answers (CatchUp)
      watcher.backlog.clear();
      VMMIPC_LOG_ERROR(
          "follow: importer {} missed pauses and resumes of more than {} chunks; once it "
          "answers it is told to drop its mappings of this process's memory, and is no longer "
          "followed",
          PeerPidText(watcher.pid), max_backlog_);
      break;
    }
    watcher.Fold(notice.kind == wire::EventKind::kResume, notice.base, notice.size,
                 notice.generation);
  }
  target.next = target.notices.size();
  // Sent and not acked: the follower still reads them when it runs, but
  // they are no longer this call's to wait for.
  for (auto& [sequence, notice] : watcher.outstanding) notice = -1;
  result->lagging.push_back(watcher.follower);
  if (cause == LagCause::kMissedDeadline)
    result->newly_lagging.emplace_back(watcher.follower, watcher.pid);
}

bool Watchers::SendNotices(Target& target, const std::vector<WatchNotice>& notices, int stop_fd,
                           NotifyResult* result) {
  while (target.next < target.notices.size()) {
    const size_t index = target.notices[target.next];
    const WatchNotice& notice = notices[index];
    wire::Event event;
    event.kind = notice.kind;
    event.base = notice.base;
    event.size = notice.size;
    event.generation = notice.generation;
    bool would_block = false;
    if (!target.watcher->Send(event, notice.fd, static_cast<int>(index), Deadline::AfterMs(0),
                              stop_fd, &would_block))
      return false;
    if (would_block) return true;
    ++target.next;
    ++result->events_sent;
  }
  return true;
}

void Watchers::Exchange(std::vector<Target>& targets, const std::vector<WatchNotice>& notices,
                        const Deadline& deadline, int stop_fd, NotifyResult* result) {
  std::vector<pollfd> pfds;
  std::vector<Target*> polled;
  for (;;) {
    pfds.clear();
    polled.clear();
    for (Target& target : targets) {
      Watcher& watcher = *target.watcher;
      if (watcher.dead || watcher.lagging || watcher.state != Watcher::State::kActive) continue;
      short events = 0;
      if (target.next < target.notices.size()) events |= POLLOUT;
      if (target.WaitsForAck()) events |= POLLIN;
      if (events == 0) continue;
      pfds.push_back({watcher.fd.get(), events, 0});
      polled.push_back(&target);
    }
    if (polled.empty()) return;
    pfds.push_back({stop_fd, POLLIN, 0});
    const int n = ::poll(pfds.data(), pfds.size(), deadline.RemainingMs());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || (stop_fd >= 0 && pfds.back().revents != 0)) return;
    for (size_t i = 0; i < polled.size(); ++i) {
      const short revents = pfds[i].revents;
      Target& target = *polled[i];
      const bool gone = (revents & (POLLERR | POLLHUP | POLLNVAL)) != 0 && (revents & POLLIN) == 0;
      if (((revents & POLLIN) != 0 &&
           !target.watcher->ReadAcks(&result->done, Watcher::kAcksPerPass, &deadline)) ||
          gone || ((revents & POLLOUT) != 0 && !SendNotices(target, notices, stop_fd, result)))
        Drop(target.watcher);  // out of protocol, a flood, or the importer exited
    }
    // One pass at least, then the deadline ends the wait whatever still
    // arrives: a follower that keeps the connection readable (a flood of
    // acks) no longer keeps the poll above returning at once for ever.
    if (deadline.Expired()) return;
  }
}

NotifyResult Watchers::Notify(const std::vector<WatchNotice>& notices, int timeout_ms,
                              int stop_fd) {
  NotifyResult result;
  result.done.resize(notices.size());
  std::lock_guard<std::mutex> notifying(notify_mutex_);
  // A new burst when the last one is over (watchers.h); while this Notify
  // runs, the current one is not.
  if (burst_ == 0 || std::chrono::steady_clock::now() >= burst_over_at_) {
    ++burst_;
    burst_lagging_pids_.clear();
  }
  burst_over_at_ = std::chrono::steady_clock::time_point::max();
  // However this Notify ends, the burst is over a timeout after it.
  struct BurstEnd {
    std::chrono::steady_clock::time_point* over_at;
    int timeout_ms;
    ~BurstEnd() {
      *over_at = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    }
  } burst_end{&burst_over_at_, std::max(timeout_ms, 0)};
  const Deadline deadline = Deadline::AfterMs(timeout_ms);
  std::vector<Target> targets = TargetsOf(notices, deadline);
  for (Target& target : targets) {
    Watcher& watcher = *target.watcher;
    if (watcher.dead) continue;  // cancelled: its grant never went out
    if (watcher.state != Watcher::State::kActive) {
      Lag(target, notices, LagCause::kMissedDeadline, &result);  // its reply is stuck
      continue;
    }
    if (!watcher.lagging) {
      // Another follower of its process lagged in this burst: not waited for either.
      if (watcher.pid != 0 && Contains(burst_lagging_pids_, watcher.pid))
        Lag(target, notices, LagCause::kSameProcess, &result);
      continue;
    }
    // Answering again? Then it gets what it missed first, and these after
    // (still lagging, unless its burst is over).
    if (watcher.ReadAcks(&result.done, Watcher::kAcksPerPass, &deadline)) CatchUp(watcher, stop_fd);
    if (!watcher.ReadAcks(&result.done, Watcher::kAcksPerPass, &deadline) || watcher.dead)
      Drop(target.watcher);
    else if (watcher.lagging)
      Lag(target, notices, LagCause::kStillLagging, &result);
  }
  // Sends and acks together, on every watcher at once: a follower that does
  // not read holds up only its own events, never another's.
  Exchange(targets, notices, deadline, stop_fd, &result);
  // Whoever is not done by now lags: it is not waited for again until it
  // has answered everything sent before, and gets the rest as catch-up.
  for (Target& target : targets) {
    Watcher& watcher = *target.watcher;
    if (watcher.dead || watcher.lagging) continue;
    if (target.next < target.notices.size() || target.WaitsForAck())
      Lag(target, notices, LagCause::kMissedDeadline, &result);
  }
  return result;
}

}  // namespace vmmipc::transport
