// Announcements (watchers.h): a handle the application just handed out,
// sent to the watchers that asked for them, on the application's thread,
// without ever waiting. Their acks are read here (those queued at the next
// announcement), by Maintain (watchers.cc) or by the next Notify
// (watchers_notify.cc).
#include "transport/serve/watch/watchers.h"

namespace vmmipc::transport {

size_t Watchers::Announce(const WatchAnnounce& announce) noexcept {
  size_t sent = 0;
  try {
    // Whoever talks to the watchers now (a Notify, Maintain) goes on; this
    // announcement is not sent: it would only have saved time.
    std::unique_lock<std::mutex> notifying(notify_mutex_, std::try_to_lock);
    if (!notifying.owns_lock()) return 0;
    std::vector<std::shared_ptr<Watcher>> targets;
    {
      std::lock_guard<ForkMutex> lock(list_mutex_);
      for (const auto& watcher : list_)
        if (watcher->announce && !watcher->dead && !watcher->lagging &&
            watcher->state == Watcher::State::kActive)
          targets.push_back(watcher);
    }
    wire::Event event;
    event.kind = wire::EventKind::kAnnounce;
    event.base = announce.base;
    event.size = announce.size;
    event.generation = announce.generation;
    event.handle = announce.handle;
    for (const auto& watcher : targets) {
      // Its acks queued now first (never waiting, at most a bound's worth):
      // between the listener's poll turns, which may have found this lock
      // held and then sleep a poll period, the bound would stop a burst of
      // announcements to an importer that acks each at once (measured: 256
      // per 200 ms).
      if (!watcher->ReadAcks(nullptr, kMaxUnackedForAnnounce)) {
        Drop(watcher);  // out of protocol, or its importer left
        continue;
      }
      // An importer that stopped reading (or acking) costs no more entries.
      if (watcher->outstanding.size() >= max_unacked_for_announce_) continue;
      bool would_block = false;  // its connection is full: skipped, not waited for
      if (!watcher->Send(event, -1, -1, Deadline::AfterMs(0), -1, &would_block))
        Drop(watcher);  // its importer left
      else if (!would_block)
        ++sent;
    }
  } catch (...) {
    // Out of memory: the rest are not told, which costs them only speed.
  }
  return sent;
}

}  // namespace vmmipc::transport
