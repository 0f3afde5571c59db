// The watch connections' registry and the event/ack exchange on them.
#include "transport/watchers.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <deque>

#include "common/log.h"
#include "transport/fd_channel.h"

namespace vmmipc::transport {

struct Watchers::Watcher {
  ScopedFd fd;
  uint32_t pid = 0;
  SipKey key;
  wire::Nonce nonce{};
  uint32_t sequence = 0;  // of the last event sent; under notify_mutex_
  // Events sent and not acked yet, oldest first, as (sequence, notice index
  // in the current Notify; -1 for one left over from an earlier Notify).
  std::deque<std::pair<uint32_t, int>> outstanding;
  bool dead = false;
  // The last holder closes it, through the reaper if the peer left anything queued.
  ~Watcher() { CloseConnection(std::move(fd)); }
};

namespace {

// True when the peer hung up or the socket is in error: poll without waiting.
bool HungUp(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL)) != 0;
}

bool Contains(const std::vector<uint32_t>& pids, uint32_t pid) {
  return std::find(pids.begin(), pids.end(), pid) != pids.end();
}

}  // namespace

bool Watchers::Adopt(ScopedFd fd, uint32_t pid, const SipKey& key, const wire::Nonce& nonce) {
  auto watcher = std::make_shared<Watcher>();
  watcher->pid = pid;
  watcher->key = key;
  watcher->nonce = nonce;
  std::vector<std::shared_ptr<Watcher>> gone;  // closed after the lock (or by a Notify using one)
  std::lock_guard<std::mutex> lock(list_mutex_);
  // Importers that exited since: their connections report a hang-up. Only
  // looked at here, never read (Notify reads, under its own lock).
  for (auto it = list_.begin(); it != list_.end();) {
    if (HungUp((*it)->fd.get())) {
      gone.push_back(std::move(*it));
      it = list_.erase(it);
    } else {
      ++it;
    }
  }
  if (list_.size() >= kMaxWatchers) return false;
  watcher->fd = std::move(fd);
  list_.push_back(std::move(watcher));
  return true;
}

void Watchers::Drop(const std::shared_ptr<Watcher>& watcher) {
  watcher->dead = true;
  std::lock_guard<std::mutex> lock(list_mutex_);
  list_.erase(std::remove(list_.begin(), list_.end(), watcher), list_.end());
}

size_t Watchers::count() const {
  std::lock_guard<std::mutex> lock(list_mutex_);
  return list_.size();
}

NotifyResult Watchers::Notify(const std::vector<WatchNotice>& notices, int timeout_ms,
                              int stop_fd) {
  NotifyResult result;
  result.done.resize(notices.size());
  std::lock_guard<std::mutex> notifying(notify_mutex_);
  std::vector<std::shared_ptr<Watcher>> targets;
  {
    std::lock_guard<std::mutex> lock(list_mutex_);
    for (const auto& watcher : list_)
      for (const WatchNotice& notice : notices)
        if (Contains(notice.pids, watcher->pid)) {
          targets.push_back(watcher);
          break;
        }
  }
  const Deadline deadline = Deadline::AfterMs(timeout_ms);
  for (const auto& watcher : targets) {
    for (size_t i = 0; i < notices.size() && !watcher->dead; ++i) {
      const WatchNotice& notice = notices[i];
      if (!Contains(notice.pids, watcher->pid)) continue;
      wire::Event event;
      event.kind = notice.kind;
      event.sequence = ++watcher->sequence;
      event.base = notice.base;
      event.size = notice.size;
      event.generation = notice.generation;
      const auto bytes = wire::EncodeEvent(event, watcher->nonce, watcher->key);
      const int fds[1] = {notice.fd};
      const std::span<const int> attached(fds, notice.fd >= 0 ? 1 : 0);
      const IoResult io = SendMessage(watcher->fd.get(), bytes, attached, deadline, stop_fd);
      if (io.ok()) {
        watcher->outstanding.emplace_back(event.sequence, static_cast<int>(i));
        ++result.events_sent;
        continue;
      }
      if (io.status != IoStatus::kPeerClosed)
        VMMIPC_LOG_WARN(
            "follow: sending an event to importer pid {} failed: {}; dropping its "
            "watch connection",
            watcher->pid, IoStatusName(io.status));
      Drop(watcher);
    }
  }
  // The acks, from every watcher at once, until all are in or time is up.
  std::vector<uint8_t> buffer(wire::kAckSize + 1);
  for (;;) {
    std::vector<pollfd> pfds;
    std::vector<std::shared_ptr<Watcher>> waiting;
    for (const auto& watcher : targets)
      if (!watcher->dead && !watcher->outstanding.empty()) {
        pfds.push_back({watcher->fd.get(), POLLIN, 0});
        waiting.push_back(watcher);
      }
    if (waiting.empty()) break;
    pfds.push_back({stop_fd, POLLIN, 0});
    const int n = ::poll(pfds.data(), pfds.size(), deadline.RemainingMs());
    if (n < 0 && errno != EINTR) break;
    if (n == 0 || (stop_fd >= 0 && pfds.back().revents != 0)) break;
    for (size_t i = 0; i < waiting.size(); ++i) {
      if (pfds[i].revents == 0) continue;
      Watcher& watcher = *waiting[i];
      // Looked at before it is taken: a watcher has no business sending fds,
      // and one that does is closed through the reaper with them queued.
      PeekedMessage peeked;
      const IoResult io = PeekMessage(watcher.fd.get(), buffer, &peeked, Deadline::AfterMs(0));
      if (io.status == IoStatus::kTimeout) continue;
      wire::Ack ack;
      const bool valid = io.ok() && !peeked.carries_fds && !peeked.truncated &&
                         wire::ParseAck({buffer.data(), peeked.length}, watcher.nonce, watcher.key,
                                        &ack) == wire::WireError::kOk;
      if (!valid) {
        if (io.status != IoStatus::kPeerClosed)
          VMMIPC_LOG_WARN(
              "follow: importer pid {} answered out of protocol; dropping its watch "
              "connection",
              watcher.pid);
        Drop(waiting[i]);
        continue;
      }
      DiscardPeekedMessage(watcher.fd.get());
      // An ack for an event of an earlier Notify that timed out: skip it.
      while (!watcher.outstanding.empty() &&
             static_cast<int32_t>(ack.sequence - watcher.outstanding.front().first) > 0)
        watcher.outstanding.pop_front();
      if (watcher.outstanding.empty() || watcher.outstanding.front().first != ack.sequence)
        continue;  // an older, already-skipped event's ack
      const int notice = watcher.outstanding.front().second;
      watcher.outstanding.pop_front();
      if (notice >= 0 && ack.status == wire::AckStatus::kDone)
        result.done[static_cast<size_t>(notice)].push_back(watcher.pid);
    }
  }
  for (const auto& watcher : targets) {
    if (watcher->dead) continue;
    bool late = false;
    for (auto& [sequence, notice] : watcher->outstanding) {
      late = late || notice >= 0;
      notice = -1;  // its ack, if it ever comes, belongs to no Notify
    }
    if (late && !Contains(result.unanswered, watcher->pid))
      result.unanswered.push_back(watcher->pid);
  }
  return result;
}

void Watchers::AbandonAfterFork() noexcept {
  std::unique_lock<std::mutex> lock(list_mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return;  // busy at the fork: leave the copies open
  // Our copies only, by a plain close: a shutdown() would end the parent's
  // connections too (it acts on the socket, not on the descriptor).
  for (auto& watcher : list_) ::close(watcher->fd.Release());
  list_.clear();
}

}  // namespace vmmipc::transport
