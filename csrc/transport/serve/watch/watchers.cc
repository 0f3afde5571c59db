// The watch connections' registry: a watcher reserved before its request is
// served, activated or cancelled with its reply, dropped when its importer
// hangs up or breaks the protocol; the poll thread's part (PollFds, then
// Maintain); a forked child's walk-away.
#include "transport/serve/watch/watchers.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>

#include "common/log.h"

namespace vmmipc::transport {
namespace {

// What a watch connection whose importer hung up (or that is in error)
// reports in the listener's poll (watcher.cc says why not "hung up and
// nothing to read"). Nothing it left queued matters: it can no longer be
// told anything.
constexpr short kHangUp = POLLHUP | POLLERR | POLLRDHUP | POLLNVAL;

}  // namespace

Watchers::Reservation Watchers::Reserve(uint32_t follower, uint32_t pid, const SipKey& key,
                                        const wire::Nonce& nonce, bool announce,
                                        std::string* refused) {
  auto watcher = std::make_shared<Watcher>(follower, pid, key, nonce, announce);
  std::vector<std::shared_ptr<Watcher>> gone;  // closed after the lock (or by a Notify using one)
  std::lock_guard<ForkMutex> lock(list_mutex_);
  // Importers that exited since, and the follower's earlier connection (one
  // per follower: the new one replaces it, when it is the same process's).
  // Only looked at here, never read.
  const Watcher* taken = nullptr;  // the follower id's, another process's
  size_t of_process = 0;           // the other watchers of `pid`
  for (auto it = list_.begin(); it != list_.end();) {
    Watcher& w = **it;
    const bool active = w.state == Watcher::State::kActive;
    bool goes = active && !w.lagging && w.HungUp();
    if (!goes && w.follower == follower) {
      // A follower id is bound to the process that first watched with it:
      // another process's request under it (a collision of 32-bit random
      // ids, or a guess) never replaces that watch. Pid 0 (a process in
      // another pid namespace) cannot be told from another: only a watch
      // whose importer hung up is replaced then.
      if ((pid != 0 && w.pid == pid) || (active && w.HungUp()))
        goes = true;
      else
        taken = &w;
    }
    if (goes) {
      w.dead = true;
      w.state = Watcher::State::kGone;
      gone.push_back(std::move(*it));
      it = list_.erase(it);
    } else {
      of_process += pid != 0 && w.pid == pid;
      ++it;
    }
  }
  activated_.notify_all();
  auto refuse = [&](std::string why) {
    if (refused != nullptr) *refused = std::move(why);
    return nullptr;
  };
  if (taken != nullptr)
    return refuse(
        fmt::format("its follower id {:#x} is the watch of another importer, {}, which keeps it (a "
                    "collision of random ids, or a guess)",
                    follower, PeerPidText(taken->pid)));
  if (of_process >= kMaxWatchersPerProcess)
    return refuse(
        fmt::format("it keeps {} watch connections already, under other follower ids: "
                    "the most one process may",
                    of_process));
  if (list_.size() >= max_watchers_.load(std::memory_order_relaxed))
    return refuse(
        fmt::format("{} watch connections are kept already, the most this process's free fds allow",
                    list_.size()));
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

size_t Watchers::UnackedForTesting() {
  std::lock_guard<std::mutex> notifying(notify_mutex_);
  std::lock_guard<ForkMutex> lock(list_mutex_);
  size_t unacked = 0;
  for (const auto& watcher : list_) unacked += watcher->outstanding.size();
  return unacked;
}

size_t Watchers::lagging_count() const {
  std::lock_guard<ForkMutex> lock(list_mutex_);
  return static_cast<size_t>(
      std::count_if(list_.begin(), list_.end(), [](const auto& w) { return w->lagging.load(); }));
}

bool Watchers::PollFds(std::vector<pollfd>* fds) {
  std::vector<std::shared_ptr<Watcher>> unpolled;  // let go of after the lock
  std::unique_lock<std::mutex> notifying(notify_mutex_, std::try_to_lock);
  std::lock_guard<ForkMutex> lock(list_mutex_);
  unpolled.swap(polled_);
  if (!notifying.owns_lock()) return false;  // a Notify runs: it catches up whom it can
  for (const auto& watcher : list_) {
    if (watcher->dead || watcher->state != Watcher::State::kActive) continue;
    // Its hang-up; its acks only while it has events unacked (its
    // announcements', or a lagging follower's, when it runs again), which
    // Maintain then reads: an ack of nothing outstanding (a late one) would
    // otherwise wake the thread at once, again and again.
    short events = POLLRDHUP;
    if (watcher->lagging || !watcher->outstanding.empty()) events |= POLLIN;
    if (watcher->lagging) {
      if (watcher->Answered() &&
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

void Watchers::Maintain(std::span<const pollfd> polled) {
  // Importers that exited (or broke their connection): dropped here, closed
  // when polled_ lets go of them below (or when a Notify using one does).
  std::vector<std::shared_ptr<Watcher>> watched;
  {
    std::lock_guard<ForkMutex> lock(list_mutex_);
    watched.swap(polled_);
  }
  // The others that were sent acks: read below (announcements' acks come
  // when no Notify runs: unread, they would fill the exporter's queue).
  std::vector<std::shared_ptr<Watcher>> answered;
  for (size_t i = 0; i < std::min(polled.size(), watched.size()); ++i) {
    if ((polled[i].revents & kHangUp) != 0)
      Drop(watched[i]);
    else if ((polled[i].revents & POLLIN) != 0)
      answered.push_back(watched[i]);
  }
  std::vector<std::shared_ptr<Watcher>> lagging;
  {
    std::lock_guard<ForkMutex> lock(list_mutex_);
    for (const auto& watcher : list_)
      if (watcher->lagging) lagging.push_back(watcher);
  }
  if (lagging.empty() && answered.empty()) return;
  // Another talks to the watchers: a Notify (which reads the acks and
  // catches up whom it can) or an Announce; the next turn does the rest.
  std::unique_lock<std::mutex> notifying(notify_mutex_, std::try_to_lock);
  if (!notifying.owns_lock()) return;
  for (const auto& watcher : answered) {
    if (watcher->dead || watcher->lagging || watcher->state != Watcher::State::kActive) continue;
    if (!watcher->ReadAcks(nullptr)) Drop(watcher);
  }
  for (const auto& watcher : lagging) {
    if (watcher->dead || watcher->state != Watcher::State::kActive) continue;
    if (watcher->HungUp() || !watcher->ReadAcks(nullptr)) {
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
