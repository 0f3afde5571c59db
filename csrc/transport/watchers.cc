// The watch connections' registry, the event/ack exchange on them, and the
// lagging followers' backlogs and catch-up.
#include "transport/watchers.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <deque>

#include "common/log.h"

namespace vmmipc::transport {

struct Watchers::Watcher {
  enum class State { kReplying, kActive, kGone };
  ScopedFd fd;  // set by Activate
  uint32_t follower = 0;
  uint32_t pid = 0;  // for log lines only: holders are followers, never pids
  SipKey key;
  wire::Nonce nonce{};
  std::atomic<State> state{State::kReplying};  // written under list_mutex_
  std::atomic<bool> dead{false};
  std::atomic<bool> lagging{false};  // written under notify_mutex_
  // Under notify_mutex_ from here on.
  uint32_t sequence = 0;  // of the last event sent
  // Events sent and not acked yet, oldest first, as (sequence, notice index
  // in the current Notify; -1 for one of an earlier Notify or a catch-up).
  std::deque<std::pair<uint32_t, int>> outstanding;
  // A lagging follower's missed notices, one entry per chunk base: what it
  // holds of the chunk after the last event sent to it, and what is there now.
  struct Missed {
    bool held_mapped = false;
    uint64_t held_generation = 0;
    uint64_t held_size = 0;
    bool now_mapped = false;
    uint64_t now_generation = 0;
    uint64_t now_size = 0;
    bool stale = false;  // its resume's memory changed again: wait for that notice
  };
  std::map<uint64_t, Missed> backlog;
  // The last event sent when it became lagging: it has answered once its
  // acks go past it (Answered).
  uint32_t lag_sequence = 0;
  // It missed more than kMaxBacklog chunks: its catch-up is one kUnfollowed
  // event (it drops what it holds of this exporter), then the connection goes.
  bool overflowed = false;
  // The last holder closes it, through the reaper if the peer left anything queued.
  ~Watcher() { CloseConnection(std::move(fd)); }
};

namespace {

// What a watch connection whose importer hung up (or that is in error)
// reports. Not "hung up and nothing to read": a Unix socket whose peer
// closed polls readable too (its EOF), so that test never held for an
// importer that exited. Nothing it left queued matters: it can no longer be
// told anything.
constexpr short kHangUp = POLLHUP | POLLERR | POLLRDHUP | POLLNVAL;

// True when the peer hung up or the socket is in error: poll without waiting.
bool HungUp(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & kHangUp) != 0;
}

bool Contains(const std::vector<uint32_t>& ids, uint32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

}  // namespace

Watchers::Reservation Watchers::Reserve(uint32_t follower, uint32_t pid, const SipKey& key,
                                        const wire::Nonce& nonce) {
  auto watcher = std::make_shared<Watcher>();
  watcher->follower = follower;
  watcher->pid = pid;
  watcher->key = key;
  watcher->nonce = nonce;
  std::vector<std::shared_ptr<Watcher>> gone;  // closed after the lock (or by a Notify using one)
  std::lock_guard<ForkMutex> lock(list_mutex_);
  // Importers that exited since, and the follower's earlier connection (one
  // per follower: the new one replaces it). Only looked at here, never read.
  for (auto it = list_.begin(); it != list_.end();) {
    Watcher& w = **it;
    if (w.follower == follower ||
        (w.state == Watcher::State::kActive && !w.lagging && HungUp(w.fd.get()))) {
      w.dead = true;
      w.state = Watcher::State::kGone;
      gone.push_back(std::move(*it));
      it = list_.erase(it);
    } else {
      ++it;
    }
  }
  activated_.notify_all();
  if (list_.size() >= max_watchers_.load(std::memory_order_relaxed)) return nullptr;
  list_.push_back(watcher);
  return watcher;
}

void Watchers::Activate(const Reservation& watcher, ScopedFd fd) {
  {
    std::lock_guard<ForkMutex> lock(list_mutex_);
    if (watcher->state != Watcher::State::kReplying) return;  // replaced meanwhile: fd closes
    watcher->fd = std::move(fd);
    watcher->state = Watcher::State::kActive;
  }
  activated_.notify_all();
}

void Watchers::Cancel(const Reservation& watcher) {
  {
    std::lock_guard<ForkMutex> lock(list_mutex_);
    watcher->dead = true;
    watcher->state = Watcher::State::kGone;
    list_.erase(std::remove(list_.begin(), list_.end(), watcher), list_.end());
  }
  activated_.notify_all();
}

void Watchers::Drop(const std::shared_ptr<Watcher>& watcher) {
  watcher->dead = true;
  std::lock_guard<ForkMutex> lock(list_mutex_);
  watcher->state = Watcher::State::kGone;
  list_.erase(std::remove(list_.begin(), list_.end(), watcher), list_.end());
}

size_t Watchers::count() const {
  std::lock_guard<ForkMutex> lock(list_mutex_);
  return list_.size();
}

size_t Watchers::lagging_count() const {
  std::lock_guard<ForkMutex> lock(list_mutex_);
  return static_cast<size_t>(
      std::count_if(list_.begin(), list_.end(), [](const auto& w) { return w->lagging.load(); }));
}

void Watchers::Fold(Watcher& watcher, const WatchNotice& notice) {
  auto it = watcher.backlog.find(notice.base);
  if (it == watcher.backlog.end()) {
    if (watcher.backlog.size() >= max_backlog_) return;  // checked by the caller
    Watcher::Missed missed;
    // Before this notice the follower held what it says changed: a pause
    // takes a mapped chunk away, a resume maps a paused one.
    missed.held_mapped = notice.kind == wire::EventKind::kPause;
    missed.held_generation = notice.generation;
    missed.held_size = notice.size;
    it = watcher.backlog.emplace(notice.base, missed).first;
  }
  it->second.stale = false;
  it->second.now_mapped = notice.kind == wire::EventKind::kResume;
  it->second.now_generation = notice.generation;
  it->second.now_size = notice.size;
}

bool Watchers::SendEvent(Watcher& watcher, const wire::Event& event, int fd, int notice,
                         const Deadline& deadline, int stop_fd, bool* would_block) {
  wire::Event numbered = event;
  numbered.sequence = watcher.sequence + 1;
  const auto bytes = wire::EncodeEvent(numbered, watcher.nonce, watcher.key);
  const int fds[1] = {fd};
  const IoResult io = SendMessage(watcher.fd.get(), bytes,
                                  std::span<const int>(fds, fd >= 0 ? 1 : 0), deadline, stop_fd);
  *would_block = io.status == IoStatus::kTimeout || io.status == IoStatus::kStopped;
  if (io.ok()) {
    watcher.sequence = numbered.sequence;
    watcher.outstanding.emplace_back(numbered.sequence, notice);
    return true;
  }
  if (*would_block) return true;
  if (io.status != IoStatus::kPeerClosed)
    VMMIPC_LOG_WARN(
        "follow: sending an event to importer pid {} failed: {}; dropping its watch connection",
        watcher.pid, IoStatusName(io.status));
  return false;
}

bool Watchers::ReadAcks(Watcher& watcher, NotifyResult* result) {
  std::vector<uint8_t> buffer(wire::kAckSize + 1);
  for (;;) {
    // Looked at before it is taken: a watcher has no business sending fds,
    // and one that does is closed through the reaper with them queued.
    PeekedMessage peeked;
    const IoResult io = PeekMessage(watcher.fd.get(), buffer, &peeked, Deadline::AfterMs(0));
    if (io.status == IoStatus::kTimeout) return true;
    wire::Ack ack;
    const bool valid = io.ok() && !peeked.carries_fds && !peeked.truncated &&
                       wire::ParseAck({buffer.data(), peeked.length}, watcher.nonce, watcher.key,
                                      &ack) == wire::WireError::kOk;
    if (!valid) {
      if (io.status != IoStatus::kPeerClosed)
        VMMIPC_LOG_WARN(
            "follow: importer pid {} answered out of protocol; dropping its watch connection",
            watcher.pid);
      return false;
    }
    DiscardPeekedMessage(watcher.fd.get());
    // Acks come in the order of the events: one for a later event means the
    // ones before it were skipped (never, from a well-behaved importer).
    while (!watcher.outstanding.empty() &&
           static_cast<int32_t>(ack.sequence - watcher.outstanding.front().first) > 0)
      watcher.outstanding.pop_front();
    if (watcher.outstanding.empty() || watcher.outstanding.front().first != ack.sequence)
      continue;  // an older, already-skipped event's ack
    const int notice = watcher.outstanding.front().second;
    watcher.outstanding.pop_front();
    if (notice >= 0 && ack.status == wire::AckStatus::kDone)
      result->done[static_cast<size_t>(notice)].push_back(watcher.follower);
  }
}

// Whether a lagging follower has acked every event sent before it lagged.
bool Watchers::Answered(const Watcher& watcher) {
  return watcher.outstanding.empty() ||
         static_cast<int32_t>(watcher.outstanding.front().first - watcher.lag_sequence) > 0;
}

void Watchers::CatchUp(Watcher& watcher, int stop_fd) {
  if (!watcher.lagging || !Answered(watcher)) return;
  const Deadline now = Deadline::AfterMs(0);  // never waits: a full buffer means later
  bool would_block = false;
  if (watcher.overflowed) {
    wire::Event unfollowed;
    unfollowed.kind = wire::EventKind::kUnfollowed;
    if (!SendEvent(watcher, unfollowed, -1, -1, now, stop_fd, &would_block)) {
      watcher.dead = true;
      return;
    }
    if (would_block) return;
    VMMIPC_LOG_DEBUG("follow: importer pid {} was told to drop its mappings of this process",
                     watcher.pid);
    watcher.lagging = false;
    watcher.dead = true;  // the caller drops it
    return;
  }
  // As many events as the connection takes now; the listener's poll thread
  // comes back when it takes more (PollFds), so the catch-up goes at the
  // follower's pace, not at the poll period's.
  for (auto it = watcher.backlog.begin(); it != watcher.backlog.end();) {
    Watcher::Missed& missed = it->second;
    if (missed.stale) {
      ++it;
      continue;
    }
    const bool same = missed.held_mapped == missed.now_mapped &&
                      (!missed.now_mapped || missed.held_generation == missed.now_generation);
    if (!same && missed.held_mapped) {
      wire::Event pause;
      pause.kind = wire::EventKind::kPause;
      pause.base = it->first;
      pause.size = missed.held_size;
      pause.generation = missed.held_generation;
      if (!SendEvent(watcher, pause, -1, -1, now, stop_fd, &would_block)) {
        watcher.dead = true;
        return;
      }
      if (would_block) return;
      missed.held_mapped = false;
    }
    if (!same && missed.now_mapped) {
      ScopedFd fd = resume_fd_ ? resume_fd_(it->first, missed.now_generation) : ScopedFd();
      if (!fd.valid()) {
        // Changed again since: the notice that changed it is folded in
        // too, and makes the entry current again (Fold).
        missed.stale = true;
        ++it;
        continue;
      }
      wire::Event resume;
      resume.kind = wire::EventKind::kResume;
      resume.base = it->first;
      resume.size = missed.now_size;
      resume.generation = missed.now_generation;
      if (!SendEvent(watcher, resume, fd.get(), -1, now, stop_fd, &would_block)) {
        watcher.dead = true;
        return;
      }
      if (would_block) return;
    }
    it = watcher.backlog.erase(it);
  }
  if (!watcher.backlog.empty()) return;  // stale entries wait for their notice
  watcher.lagging = false;
  VMMIPC_LOG_INFO("follow: importer pid {} answers again and was sent what it missed", watcher.pid);
}

bool Watchers::PollFds(std::vector<pollfd>* fds) {
  std::vector<std::shared_ptr<Watcher>> unpolled;  // let go of after the lock
  std::unique_lock<std::mutex> notifying(notify_mutex_, std::try_to_lock);
  std::lock_guard<ForkMutex> lock(list_mutex_);
  unpolled.swap(polled_);
  if (!notifying.owns_lock()) return false;  // a Notify runs: it catches up whom it can
  for (const auto& watcher : list_) {
    if (watcher->dead || watcher->state != Watcher::State::kActive) continue;
    // Only its hang-up, unless it lags: the late ack of an event whose wait
    // timed out may sit unread until the next Notify, and would wake the
    // thread at once, again and again.
    short events = POLLRDHUP;
    if (watcher->lagging) {
      events |= POLLIN;  // its acks, when it runs again
      if (Answered(*watcher) &&
          (watcher->overflowed ||
           std::any_of(watcher->backlog.begin(), watcher->backlog.end(),
                       [](const auto& entry) { return !entry.second.stale; })))
        events |= POLLOUT;  // room for more of its catch-up
    }
    fds->push_back({watcher->fd.get(), events, 0});
    polled_.push_back(watcher);
  }
  return true;
}

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
  // reply (the same connection), so wait for it, within the one deadline.
  auto replying = [&] {
    return std::any_of(targets.begin(), targets.end(), [](const Target& t) {
      return t.watcher->state == Watcher::State::kReplying;
    });
  };
  while (replying() && !deadline.Expired())
    activated_.wait_for(lock, std::chrono::milliseconds(deadline.RemainingMs()));
  return targets;
}

void Watchers::Lag(Target& target, const std::vector<WatchNotice>& notices, bool newly,
                   NotifyResult* result) {
  Watcher& watcher = *target.watcher;
  if (newly) watcher.lag_sequence = watcher.sequence;
  if (!watcher.lagging) watcher.lagging = true;
  for (size_t k = target.next; k < target.notices.size() && !watcher.overflowed; ++k) {
    const WatchNotice& notice = notices[target.notices[k]];
    if (watcher.backlog.size() >= max_backlog_ && watcher.backlog.count(notice.base) == 0) {
      watcher.overflowed = true;  // told to drop everything when it answers (CatchUp)
      watcher.backlog.clear();
      VMMIPC_LOG_ERROR(
          "follow: importer pid {} missed pauses and resumes of more than {} chunks; once it "
          "answers it is told to drop its mappings of this process's memory, and is no longer "
          "followed",
          watcher.pid, max_backlog_);
      break;
    }
    Fold(watcher, notice);
  }
  target.next = target.notices.size();
  // Sent and not acked: the follower still reads them when it runs, but
  // they are no longer this call's to wait for.
  for (auto& [sequence, notice] : watcher.outstanding) notice = -1;
  result->lagging.push_back(watcher.follower);
  if (newly) result->newly_lagging.emplace_back(watcher.follower, watcher.pid);
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
    if (!SendEvent(*target.watcher, event, notice.fd, static_cast<int>(index), Deadline::AfterMs(0),
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
      if (((revents & POLLIN) != 0 && !ReadAcks(*target.watcher, result)) || gone ||
          ((revents & POLLOUT) != 0 && !SendNotices(target, notices, stop_fd, result)))
        Drop(target.watcher);  // out of protocol, or the importer exited
    }
  }
}

NotifyResult Watchers::Notify(const std::vector<WatchNotice>& notices, int timeout_ms,
                              int stop_fd) {
  NotifyResult result;
  result.done.resize(notices.size());
  std::lock_guard<std::mutex> notifying(notify_mutex_);
  const Deadline deadline = Deadline::AfterMs(timeout_ms);
  std::vector<Target> targets = TargetsOf(notices, deadline);
  for (Target& target : targets) {
    Watcher& watcher = *target.watcher;
    if (watcher.dead) continue;  // cancelled: its grant never went out
    if (watcher.state != Watcher::State::kActive) {
      Lag(target, notices, /*newly=*/true, &result);  // its reply is stuck
      continue;
    }
    if (!watcher.lagging) continue;
    // Answering again? Then it gets what it missed first, and these after.
    if (ReadAcks(watcher, &result)) CatchUp(watcher, stop_fd);
    if (!ReadAcks(watcher, &result) || watcher.dead)
      Drop(target.watcher);
    else if (watcher.lagging)
      Lag(target, notices, /*newly=*/false, &result);
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
      Lag(target, notices, /*newly=*/true, &result);
  }
  return result;
}

void Watchers::Maintain(std::span<const pollfd> polled) {
  // Importers that exited (or broke their connection): dropped here, closed
  // when polled_ lets go of them below (or when a Notify using one does).
  std::vector<std::shared_ptr<Watcher>> watched;
  {
    std::lock_guard<ForkMutex> lock(list_mutex_);
    watched.swap(polled_);
  }
  for (size_t i = 0; i < std::min(polled.size(), watched.size()); ++i)
    if ((polled[i].revents & kHangUp) != 0) Drop(watched[i]);
  std::vector<std::shared_ptr<Watcher>> lagging;
  {
    std::lock_guard<ForkMutex> lock(list_mutex_);
    for (const auto& watcher : list_)
      if (watcher->lagging) lagging.push_back(watcher);
  }
  if (lagging.empty()) return;
  std::unique_lock<std::mutex> notifying(notify_mutex_, std::try_to_lock);
  if (!notifying.owns_lock()) return;  // a Notify runs: it catches up whom it can
  NotifyResult ignored;
  for (const auto& watcher : lagging) {
    if (watcher->dead || watcher->state != Watcher::State::kActive) continue;
    if (HungUp(watcher->fd.get()) || !ReadAcks(*watcher, &ignored)) {
      Drop(watcher);
      continue;
    }
    CatchUp(*watcher, -1);
    if (watcher->dead) Drop(watcher);
  }
}

void Watchers::AbandonAfterFork() noexcept {
  // False only when the thread that forked held the list itself: leave the copies open.
  if (!list_mutex_.ChildAfterFork()) return;
  std::lock_guard<ForkMutex> lock(list_mutex_);
  // Our copies only, by a plain close: a shutdown() would end the parent's
  // connections too (it acts on the socket, not on the descriptor).
  for (auto& watcher : list_)
    if (watcher->fd.valid()) ::close(watcher->fd.Release());
  list_.clear();
  // Those the poll thread was polling: one dropped from the list meanwhile
  // is still open here.
  for (auto& watcher : polled_)
    if (watcher->fd.valid()) ::close(watcher->fd.Release());
  polled_.clear();
}

}  // namespace vmmipc::transport
