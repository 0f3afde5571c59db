// Watcher: one kept watch connection of the exporter and its follower's
// state (what was sent and not acked, and, while it lags, what it missed);
// the primitives on it: one event sent, the acks read, a notice folded into
// its backlog. The registry and the Notify that use it are Watchers
// (watchers.h); a Watcher's fields are guarded by Watchers' locks, as each
// says.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <utility>
#include <vector>

#include "common/scoped_fd.h"
#include "transport/siphash.h"
#include "transport/socket_io.h"
#include "transport/wire.h"

namespace vmmipc::transport {

class Watcher {
 public:
  enum class State { kReplying, kActive, kGone };

  Watcher(uint32_t follower, uint32_t pid, const SipKey& key, const wire::Nonce& nonce,
          bool announce)
      : follower(follower), pid(pid), key(key), nonce(nonce), announce(announce) {}
  Watcher(const Watcher&) = delete;
  Watcher& operator=(const Watcher&) = delete;
  // The last holder closes the connection, through the reaper if the peer
  // left anything queued.
  ~Watcher();

  // Sends `event` (numbered next; a kAnnounce in its longer layout) with
  // `fd` if valid; `notice` is its index in the current Notify (-1 for
  // none). Waits for room until `deadline` (one already due: never). False
  // when the watcher must go; a full connection or a stop is *would_block,
  // not a failure (nothing was sent, the sequence is unchanged).
  bool Send(const wire::Event& event, int fd, int notice, const Deadline& deadline, int stop_fd,
            bool* would_block);
  // Acks read by one ReadAcks at most (docs/security.md, "Reading from a
  // peer"): one pass of a loop that reads them; what is left stays queued
  // for the next pass, after the thread's other work.
  static constexpr size_t kAcksPerPass = 256;
  // Acks of no event outstanding (a sequence never sent, already acked or
  // skipped) a watcher may send in its connection's life: an importer acks
  // each event once, in order, so it sends none. Past this many it floods:
  // ReadAcks drops it (one warning), and nobody waits for it again.
  static constexpr size_t kMaxStrayAcks = 64;

  // Reads the acks queued now without waiting: at most `max_acks`, and no
  // more once `deadline` is past (the first is always looked at). False when the
  // watcher must go (out of protocol, a flood of acks of nothing
  // outstanding, or the importer left). The follower is added to
  // (*done)[notice] for each current notice acked kDone. `deadline`: none
  // when null.
  bool ReadAcks(std::vector<std::vector<uint32_t>>* done, size_t max_acks = kAcksPerPass,
                const Deadline* deadline = nullptr);
  // Whether a lagging follower has acked every event sent before it lagged.
  bool Answered() const;
  // Whether the importer hung up (or the socket is in error): never waits.
  bool HungUp() const;
  // Folds a missed notice of chunk `base` into the backlog (a pause when
  // `resume` is false); the caller checks the backlog's bound first.
  void Fold(bool resume, uint64_t base, uint64_t size, uint32_t generation);

  ScopedFd fd;  // set by Watchers::Activate
  const uint32_t follower;
  const uint32_t pid;  // for log lines only: holders are followers, never pids
  const SipKey key;
  const wire::Nonce nonce;
  const bool announce;  // its watch request asked for announcements (kRequestFlagAnnounce)
  std::atomic<State> state{State::kReplying};  // written under Watchers' list_mutex_
  std::atomic<bool> dead{false};
  std::atomic<bool> lagging{false};  // written under Watchers' notify_mutex_
  // Under Watchers' notify_mutex_ from here on.
  uint32_t sequence = 0;  // of the last event sent
  // Events sent and not acked yet, oldest first, as (sequence, notice index
  // in the current Notify; -1 for one of an earlier Notify or a catch-up).
  std::deque<std::pair<uint32_t, int>> outstanding;
  // A lagging follower's missed notices, one entry per chunk base: what it
  // holds of the chunk after the last event sent to it, and what is there now.
  struct Missed {
    bool held_mapped = false;
    uint32_t held_generation = 0;
    uint64_t held_size = 0;
    bool now_mapped = false;
    uint32_t now_generation = 0;
    uint64_t now_size = 0;
    bool stale = false;  // its resume's memory changed again: wait for that notice
  };
  std::map<uint64_t, Missed> backlog;
  // The last event sent when it became lagging: it has answered once its
  // acks go past it (Answered).
  uint32_t lag_sequence = 0;
  // The burst (Watchers.h: consecutive Notifies) in which it last lagged;
  // 0: never. It is not waited for again, nor stops lagging, until that
  // burst is over: a follower costs a burst at most one timeout.
  uint64_t lag_burst = 0;
  // Acks of nothing outstanding so far (kMaxStrayAcks).
  size_t stray_acks = 0;
  // It missed more than the backlog's bound: its catch-up is one kUnfollowed
  // event (it drops what it holds of this exporter), then the connection goes.
  bool overflowed = false;
};

}  // namespace vmmipc::transport
