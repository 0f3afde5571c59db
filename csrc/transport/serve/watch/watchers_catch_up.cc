// A lagging follower's catch-up: what it missed (folded into one backlog
// entry per chunk it holds: Watcher::Fold), sent once it has acked
// everything sent before it lagged, as many events as its connection takes
// without waiting.
#include "common/log.h"
#include "transport/serve/watch/watchers.h"

namespace vmmipc::transport {

namespace {

// A follower that missed more than its backlog holds gets one `unfollowed`
// event, once its connection takes it, and is then dropped by the caller.
void TellUnfollowed(Watcher& watcher, int stop_fd) {
  wire::Event unfollowed;
  unfollowed.kind = wire::EventKind::kUnfollowed;
  bool would_block = false;
  if (!watcher.Send(unfollowed, -1, -1, Deadline::AfterMs(0), stop_fd, &would_block)) {
    watcher.dead = true;
    return;
  }
  if (would_block) return;
  VMMIPC_LOG_DEBUG("follow: importer {} was told to drop its mappings of this process",
                   PeerPidText(watcher.pid));
  watcher.lagging = false;
  watcher.dead = true;  // the caller drops it
}

}  // namespace

void Watchers::CatchUp(Watcher& watcher, int stop_fd) {
  if (!watcher.lagging || !watcher.Answered()) return;
  const Deadline now = Deadline::AfterMs(0);  // never waits: a full buffer means later
  bool would_block = false;
  if (watcher.overflowed) {
    TellUnfollowed(watcher, stop_fd);
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
      if (!watcher.Send(pause, -1, -1, now, stop_fd, &would_block)) {
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
      if (!watcher.Send(resume, fd.get(), -1, now, stop_fd, &would_block)) {
        watcher.dead = true;
        return;
      }
      if (would_block) return;
    }
    it = watcher.backlog.erase(it);
  }
  if (!watcher.backlog.empty()) return;  // stale entries wait for their notice
  // Caught up, but it lagged in the burst still going on: not waited for
  // again before that burst is over (watchers.h); Maintain, on the
  // listener's poll period, or the next burst's first Notify ends its lag.
  if (LaggedThisBurst(watcher)) return;
  watcher.lagging = false;
  VMMIPC_LOG_INFO("follow: importer {} answers again and was sent what it missed",
                  PeerPidText(watcher.pid));
}

}  // namespace vmmipc::transport
