// Watchers::Watcher, one kept watch connection and its follower's state:
// the entry that the watchers' files share (internal to the transport
// layer). The registry is watchers.cc, the event/ack exchange of a Notify
// watchers_notify.cc, a lagging follower's backlog and catch-up
// watchers_catch_up.cc.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <utility>

#include "transport/reaper/fd_reaper.h"
#include "transport/serve/watchers.h"

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
  // It missed more than kMaxBacklog chunks: its catch-up is one kUnfollowed
  // event (it drops what it holds of this exporter), then the connection goes.
  bool overflowed = false;
  // The last holder closes it, through the reaper if the peer left anything queued.
  ~Watcher() { CloseConnection(std::move(fd)); }
};

}  // namespace vmmipc::transport
