// Watchers: the exporter's kept watch connections, one per follower (an
// importer process that follows, named by the random follower id of its
// requests), and the events sent on them when the exporter unmaps or maps
// again memory that followers hold (a memory saver's pause and resume:
// docs/protocol.md, "Follow"). An event goes only to the followers named
// with it (those the chunk was granted to).
//
// The order of the events that can race (docs/protocol.md, "Follow: the
// order of events"):
//  - A watch request and a pause: the watcher is reserved before the request
//    is served, so a grant made under it is always told; an event for a
//    watcher whose reply is still being sent waits (bounded) until the reply
//    is out, so it follows the reply on the connection.
//  - A follower that misses a deadline is lagging: it is not sent to or
//    waited for again; what it misses is folded into a backlog of at most
//    one entry per chunk it holds (the chunk's state then and now), and sent
//    as catch-up events once it has acked everything sent before (checked at
//    each Notify and by Maintain, on the listener's thread).
//  - The bound is per burst, not per Notify: a pause or resume of many
//    allocations is one Notify per allocation (one cuMemUnmap or cuMemMap
//    each), and a burst is a run of Notifies each starting within the
//    timeout of the previous one's end. In order: a Notify starts (a new
//    burst if the last one ended a timeout ago or more); the followers that
//    lag are not waited for; the others are sent their notices and waited
//    for together, until one deadline; whoever missed it lags, marked with
//    this burst, and so does every other follower of the same process (by
//    SO_PEERCRED pid; pid 0, a process in another pid namespace, only
//    itself): one process cannot make a burst wait once per follower id.
//    A follower marked with the current burst keeps lagging even when it
//    answers everything (its later notices go to its backlog and are sent
//    as catch-up, without waiting) until the burst is over; only then does
//    it stop lagging and get waited for again. So a follower, or a process,
//    costs a burst at most one timeout, whether it is silent, stopped, slow,
//    or answers each event just after its deadline (which before cleared
//    its lag at the next Notify, and cost the timeout again, per allocation).
//
// Announcements (docs/protocol.md, "Announcements"): when the application
// hands out a handle (cuIpcGetMemHandle, on its own thread), Announce tells
// the watchers whose request asked (kRequestFlagAnnounce). It never waits,
// and a lost announcement costs only speed, so:
//  - Announce and a Notify (or a catch-up, Maintain, PollFds): both take
//    notify_mutex_, Announce only by a try-lock; if anything else holds it,
//    the announcement is not sent (0). So the two are never interleaved on
//    a connection: every event on it is numbered in the order it was sent.
//  - Announce and a watcher still replying, or lagging, or past
//    kMaxUnackedForAnnounce unacked events: it is skipped. An announcement
//    is never folded into a backlog, never waited for, never caught up.
//  - Announce and a full connection: the send does not wait (a deadline
//    already due); that watcher is skipped. One whose send fails (its
//    importer left) is dropped, as a Notify drops it.
//  - Announce and Maintain: the acks of announcements are read by Maintain
//    (PollFds waits for POLLIN on every watcher with unacked events), so
//    that an importer that acks every announcement never finds the
//    exporter's receive queue full, even when no Notify ever runs; and by
//    the next Announce, those queued then (at most the bound's worth,
//    without waiting): a poll turn whose PollFds lost the try-lock to an
//    Announce sleeps a poll period, and the bound alone would then hold a
//    burst of announcements to 256 per period.
//  - Announce takes list_mutex_ only to copy the list, as every other path
//    does (never held across I/O); the one longer wait it can meet there is
//    a fork in progress in another thread (a fork lock).
//
// Threads: Reserve/Activate/Cancel run on the listener's threads, Notify
// and Announce on the application's (the thread that unmaps or maps, or
// hands out a handle), Maintain on the listener's poll thread. One Notify,
// Announce or Maintain at a time talks to the watchers (notify_mutex_;
// Announce and Maintain only try it); the list is guarded by
// list_mutex_, held only to add, remove or copy entries, never across I/O
// (a poll() that does not wait, to find hung-up entries, aside). Entries are
// shared_ptrs so that a Notify in progress keeps its own. list_mutex_ is a
// fork lock (common/fork_lock.h): a fork waits for its holder, so that a
// forked child always finds the list whole and closes its copies of the
// connections.
#pragma once

#include <poll.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "common/fork_lock.h"
#include "common/scoped_fd.h"
#include "transport/serve/fd_budget.h"
#include "transport/serve/watch/watcher.h"
#include "transport/siphash.h"
#include "transport/socket_io.h"
#include "transport/wire.h"

namespace vmmipc::transport {

struct WatchNotice {
  wire::EventKind kind = wire::EventKind::kPause;
  uint64_t base = 0;  // the chunk's base in this (the exporter's) process
  uint64_t size = 0;
  uint32_t generation = 0;          // kPause: the one unmapped; kResume: the new one
  int fd = -1;                      // kResume: the new memory's exported fd (borrowed), sent along
  std::vector<uint32_t> followers;  // the follower ids it is for
};

// The exporter handed out `handle` for the chunk at `base` (an
// announcement: Watchers::Announce).
struct WatchAnnounce {
  uint64_t base = 0;  // the chunk's base in this (the exporter's) process
  uint64_t size = 0;
  uint32_t generation = 0;
  std::array<uint8_t, wire::kAnnouncedHandleSize> handle{};
};

struct NotifyResult {
  std::vector<std::vector<uint32_t>> done;  // per notice: the followers that answered kDone
  // Followers that hold the chunks but were not waited for: lagging, they
  // get the notices as catch-up events later. They still follow.
  std::vector<uint32_t> lagging;
  // Of those, the ones that became lagging in this Notify (pid for the log).
  std::vector<std::pair<uint32_t, uint32_t>> newly_lagging;  // (follower, pid)
  size_t events_sent = 0;
};

// Makes the fd of the memory mapped now at `base` with `generation`, for a
// catch-up resume; invalid when that mapping is gone or changed.
using ResumeFdSource = std::function<ScopedFd(uint64_t base, uint32_t generation)>;

class Watchers {
 public:
  // At most this many watch connections (the listener lowers it to what the
  // host's free fds allow: fd_budget.h); past it a request's connection is
  // closed after its reply as without the flag (its follower is not told).
  void SetMaxWatchers(size_t max) { max_watchers_.store(max, std::memory_order_relaxed); }
  // A lagging follower's backlog holds one entry per chunk it holds; past
  // this many its catch-up is a kUnfollowed event (it unmaps what it holds
  // of this exporter, loudly) and its connection goes.
  static constexpr size_t kMaxBacklog = 1 << 20;
  // Tests lower the bound.
  void SetMaxBacklogForTesting(size_t max) { max_backlog_ = max; }
  // A watcher with this many events unacked is sent no announcement: an
  // importer that stops reading costs the exporter at most this many
  // entries per watcher. Counts every unacked event (between Notifies a
  // watcher that does not lag has none but its announcements').
  static constexpr size_t kMaxUnackedForAnnounce = 256;
  // Tests lower the bound.
  void SetMaxUnackedForAnnounceForTesting(size_t max) { max_unacked_for_announce_ = max; }
  // Tests: the current burst is over now, as it is a timeout after its last
  // Notify (a hold point instead of that wait).
  void EndBurstForTesting() {
    std::lock_guard<std::mutex> notifying(notify_mutex_);
    burst_over_at_ = std::chrono::steady_clock::now();
  }

  using Reservation = std::shared_ptr<Watcher>;

  void SetResumeFdSource(ResumeFdSource source) { resume_fd_ = std::move(source); }

  // At most this many watch connections of one importer process (by its
  // SO_PEERCRED pid; pid 0, a process in another pid namespace, is bounded
  // by the list's bound only). An importer keeps one per exporter, under
  // its one follower id: more are another follower id's each, which only a
  // process that makes them up has (issue 36 item 4: 1,100 of them took a
  // quarter of the exporter's fd table).
  static constexpr size_t kMaxWatchersPerProcess = 4;

  // Before a watch request of `follower` (pid `pid`) is served: the watcher
  // its connection will become, listed at once (replacing an earlier one of
  // the same follower and process), so that a pause after its grant is
  // told. Null, with why in `*refused`, when the list is full, the process
  // has kMaxWatchersPerProcess already, or the follower id is another
  // process's watch (never replaced: a follower id is bound to the process
  // that first watched with it). `key` and `nonce` (the request's) MAC every
  // event; `announce`: the request asked for announcements.
  Reservation Reserve(uint32_t follower, uint32_t pid, const SipKey& key, const wire::Nonce& nonce,
                      bool announce, std::string* refused = nullptr);
  // The reply went out: `fd` is the watch connection from now on.
  void Activate(const Reservation& watcher, ScopedFd fd);
  // The reply did not go out: the watcher goes (the caller closes the connection).
  void Cancel(const Reservation& watcher);

  // Sends every notice to the watchers of its followers and waits for their
  // acks until `timeout_ms` passes or `stop_fd` becomes readable: one bound
  // for the whole call, whatever the number of notices and followers.
  // Watchers that hung up, or answered out of protocol, are dropped.
  NotifyResult Notify(const std::vector<WatchNotice>& notices, int timeout_ms, int stop_fd);

  // Sends `announce` as a kAnnounce event to every watcher that asked for
  // announcements, is active, does not lag and has fewer than
  // kMaxUnackedForAnnounce events unacked; returns how many it was sent to.
  // Never waits (see the order of events above): 0 when a Notify, a
  // catch-up or Maintain talks to the watchers now; a full connection is
  // skipped. Its acks are read by Maintain or the next Notify.
  size_t Announce(const WatchAnnounce& announce) noexcept;

  // After the listener's poll: the watch connections whose importer hung up
  // (`polled`: what PollFds added, with the poll's revents) are dropped, and
  // closed; the acks that came on the others are read (an announcement's,
  // or a late one); lagging followers that have acked everything sent before they
  // lagged get their catch-up events, as many as their connection takes now;
  // those that hung up are dropped. Never waits: the catch-up is left for
  // later when a Notify runs. Cheap when none is lagging.
  void Maintain(std::span<const pollfd> polled = {});
  // The listener's poll thread waits on these too: every watch connection,
  // for its hang-up (an importer that exits must not leave its connection
  // here until some later request: nothing else would look), those with
  // events unacked (announcements, or a lagging follower's) also for their
  // acks, and those of lagging followers for room for their catch-up, so
  // that Maintain runs when one answers or takes more. False, adding
  // nothing, when a Notify runs (the poll period brings the thread back).
  // Only the poll thread calls it, then Maintain with what it added.
  bool PollFds(std::vector<pollfd>* fds);

  size_t count() const;
  size_t lagging_count() const;
  // Tests: the events sent and not acked yet, over every watcher (waits for
  // a Notify in progress).
  size_t UnackedForTesting();

  // The fork handlers' (core/process_state.cc): before a fork, takes the
  // list's lock (waiting for its holder); after it, releases it in the parent.
  void PrepareFork() noexcept { list_mutex_.PrepareFork(); }
  void ParentAfterFork() noexcept { list_mutex_.ParentAfterFork(); }
  // A forked child: the connections belong to the parent's importers.
  // Closes its copies and forgets them.
  void AbandonAfterFork() noexcept;

 private:
  struct Target;  // one watcher's part in a Notify
  std::vector<Target> TargetsOf(const std::vector<WatchNotice>& notices, const Deadline& deadline);
  // Whether `watcher` lagged in the burst still going on (under notify_mutex_).
  bool LaggedThisBurst(const Watcher& watcher) const;
  // Why a watcher lags in a Notify: it already did (and has not caught up),
  // it missed this Notify's deadline (or its reply is stuck), or another
  // follower of its process lagged in this burst.
  enum class LagCause { kStillLagging, kMissedDeadline, kSameProcess };
  // The watcher of `target` lags from here on, for the rest of the burst at
  // least: the rest of its notices go into its backlog; it is reported in
  // `result` (as newly lagging when it missed the deadline).
  void Lag(Target& target, const std::vector<WatchNotice>& notices, LagCause cause,
           NotifyResult* result);
  // Sends what the connection takes now; false when the watcher must go.
  bool SendNotices(Target& target, const std::vector<WatchNotice>& notices, int stop_fd,
                   NotifyResult* result);
  // Sends and reads acks on every target at once until all are done or the deadline.
  void Exchange(std::vector<Target>& targets, const std::vector<WatchNotice>& notices,
                const Deadline& deadline, int stop_fd, NotifyResult* result);
  void Drop(const std::shared_ptr<Watcher>& watcher);
  // Sends a lagging watcher's backlog, if it has answered everything sent
  // before it lagged; clears its lagging state when nothing is left. Never waits.
  void CatchUp(Watcher& watcher, int stop_fd);

  mutable ForkMutex list_mutex_;
  // A reserved watcher became active or went (waited on with list_mutex_).
  std::condition_variable_any activated_;
  std::mutex notify_mutex_;
  // Under notify_mutex_: the current burst (0 before the first Notify), when
  // it is over if no Notify starts before (the last one's end plus its
  // timeout), and the pids of the processes whose followers lagged in it.
  uint64_t burst_ = 0;
  std::chrono::steady_clock::time_point burst_over_at_{};
  std::vector<uint32_t> burst_lagging_pids_;
  std::vector<std::shared_ptr<Watcher>> list_;
  ResumeFdSource resume_fd_;
  size_t max_backlog_ = kMaxBacklog;
  size_t max_unacked_for_announce_ = kMaxUnackedForAnnounce;
  std::atomic<size_t> max_watchers_{kMaxWatchConnections};
  // The watchers PollFds added, in its order, until the Maintain after the
  // poll: held, so that none of their fds is closed (and its number reused)
  // while the poll thread waits on it. Guarded by list_mutex_ (a forked
  // child closes its copies of these too).
  std::vector<std::shared_ptr<Watcher>> polled_;
};

}  // namespace vmmipc::transport
