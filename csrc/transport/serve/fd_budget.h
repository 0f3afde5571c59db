// FdBudget: how many descriptors the listener may spend on peers' connections,
// so that no peer can take the host's last ones (issue 26). Every connection
// the listener holds is an fd of the host process: one accepted and waiting
// for its request, kept for its importer's next request or as a watch
// connection, or queued with its reply's chunk fds for a worker (issue 36).
// The caps below are a
// fraction of the host's free fds (RLIMIT_NOFILE less the fds open, counted
// in /proc/self/fd), measured when the listener starts, when accept() fails
// for lack of fds and when it works again after that, and again, at most
// once a second, when a class of
// connections reaches its cap or an accepted fd's number shows that the host
// opened more since. Used by the listener's poll thread only.
#pragma once

#include <cstddef>
#include <cstdint>

namespace vmmipc::transport {

// The most of each class, whatever the headroom:
// - our uid's connections waiting for their request: importers send theirs
//   right after connecting, so many wait only in a burst of opens (every rank
//   of a node at once), or when a process of our own uid holds them silent
//   (it may also ptrace us: out of scope); what the listener allowed before.
inline constexpr size_t kMaxOwnWaiting = 512;
// - every other uid's together: such a peer is never one of our importers
//   (socket names carry the uid) and is refused kWrongUser when its request
//   comes, so a handful is enough for its refusal; a newcomer past that is
//   closed at once, and no other user's connection ever displaces ours.
inline constexpr size_t kMaxOthersWaiting = 32;
// - any one other uid's, so that two other users cannot shut each other out.
inline constexpr size_t kMaxPerOtherUid = 16;
// - kept watch connections (follow): one per importer process that follows
//   this exporter (one per follower id); 1024 is far more importer processes
//   than any one node runs.
inline constexpr size_t kMaxWatchConnections = 1024;
// - our importers' connections kept after their reply for their next request
//   (warm connections): an importer keeps a few per exporter (kWarmPerExporter
//   in transport/client/warm_connections.h), and any one peer process at
//   most kMaxKeptPerPeer here, so that one process cannot take them all.
inline constexpr size_t kMaxKeptConnections = 1024;
inline constexpr size_t kMaxKeptPerPeer = 8;
// - the fds of the replies queued for a worker (listener_workers.h): each is
//   its connection and one fd per chunk (more than a message holds: 254 at
//   least), dups the host holds until a worker sends them; a same-uid peer
//   that asks again and again while the workers are busy (each sending to a
//   peer that does not read) would queue them without end. 8192 is 32
//   replies of 256 chunks waiting at once, more than a node's importers
//   ask for while the workers are busy. One reply may always wait when none
//   does, whatever its size, so that a host short of fds is still served.
inline constexpr size_t kMaxQueuedReplyFds = 8192;

// The caps now. Each class gets a share of the fds the host has free (those
// it has not opened itself, the listener's own connections and queued
// replies counted as free): a quarter for our uid's waiting connections, a
// quarter for watch connections, an eighth for kept ones, an eighth for the
// fds of queued replies, a sixteenth for other users'. All of them full at
// once leave the host 3/16 of what it had free; never less than one of each
// (kept: none; queued replies: one reply, whatever its size), so that a host
// at its limit is still served, one peer at a time.
struct ConnectionCaps {
  size_t own_waiting = kMaxOwnWaiting;
  size_t others_waiting = kMaxOthersWaiting;
  size_t per_other_uid = kMaxPerOtherUid;
  size_t watchers = kMaxWatchConnections;
  size_t kept = kMaxKeptConnections;
  size_t queued_reply_fds = kMaxQueuedReplyFds;
};
// For a process that may open `limit` fds and has `open` open, `held` of them
// the listener's connections.
ConnectionCaps CapsFor(size_t limit, size_t open, size_t held);

// The fds open in this process (the entries of /proc/self/fd, less the one
// that reads it); -1 when that cannot be read (no /proc, or no fd to spare).
// No allocation.
long CountOpenFds() noexcept;
// Calls `visit(fd, arg)` for each fd open in this process (from
// /proc/self/fd, the one that reads it left out), in increasing order; `visit`
// may close the fd it is given. False when /proc/self/fd cannot be read. No
// allocation: safe in a forked child.
bool ForEachOpenFd(void (*visit)(int fd, void* arg), void* arg) noexcept;

class FdBudget {
 public:
  // Measures now. `out_of_fds`: accept() just failed with EMFILE, so every fd
  // the limit allows is open (and counting them would need one more).
  void Measure(size_t held, bool out_of_fds) noexcept;
  // Measures again, unless the last measurement is less than a second old;
  // true when it did. For a class at its cap: the host may have closed fds
  // since (after an EMFILE), or opened more.
  bool Refresh(size_t held) noexcept;
  // Whether `fd`, just accepted, says the host has more fds open than
  // measured: the kernel gives the lowest free number, so every fd below it
  // is open. Then Refresh.
  bool Outgrown(int fd, size_t held) const noexcept;

  const ConnectionCaps& caps() const noexcept { return caps_; }
  size_t limit() const noexcept { return limit_; }
  size_t free_fds() const noexcept { return free_; }  // at the last measurement, ours counted free

 private:
  ConnectionCaps caps_;
  size_t limit_ = 0;
  size_t host_open_ = 0;  // fds open at the last measurement, less the listener's
  size_t free_ = 0;
  int64_t measured_ms_ = 0;
};

}  // namespace vmmipc::transport
