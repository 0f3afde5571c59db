// The importer's warm connections: after a fetch, its connection is kept,
// per exporter socket name, so that the next fetch from the same exporter
// sends its request at once instead of paying socket, connect, the
// exporter's accept and both sides' credential checks, and one more thread
// wake-up on the exporter's side (docs/protocol.md, "Warm connections").
//
// Bounded: at most `limit` connections in all (ClientOptions), at most
// kWarmPerExporter per name (opens of one exporter from several threads at
// once each take one), least recently used first out. A connection is taken
// out while a fetch uses it, so no two fetches ever share one. A kept
// connection is looked at before its reuse: one the exporter hung up on (it
// exited, or closed it idle or over its budget) or that holds anything
// unasked (a hostile exporter's message, perhaps with fds) is given up
// through CloseConnection (reaper/fd_reaper.h) and the fetch connects afresh.
//
// Every close here goes through CloseConnection, never on the caller's
// thread when something may still be queued. A forked child closes its
// copies (plain closes: shutdown() would end the parent's connections too)
// and starts empty, and closes its copies of the connections fetches were
// using at the fork (ConnectionInUse); the lock is a fork lock
// (common/fork_lock.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/scoped_fd.h"

namespace vmmipc::transport {

// The most kept connections to one exporter name.
inline constexpr size_t kWarmPerExporter = 4;

// A kept connection to `name` (SocketAddress::display) that is still fit for
// a request; an invalid fd when there is none.
ScopedFd TakeWarmConnection(const std::string& name) noexcept;

// Keeps `connection` to `name` after a complete, verified exchange; with
// `limit` 0, or past the bounds, it (or the least recently used one) is
// closed instead.
void KeepWarmConnection(const std::string& name, ScopedFd connection, size_t limit) noexcept;

// A connection a fetch uses now, taken from the pool or new, for this
// object's life: a forked child closes its copy too (the thread using it
// does not exist there; before, the child kept it until exec or exit),
// unless the thread using it is the one that forked (a fork in a signal
// handler that interrupted its fetch: the fetch goes on in the child).
// Recorded by number and socket inode, so that the child closes it only
// when that number is still this connection. Without memory for the record,
// it is not recorded (the child then keeps its copy until exec, as before).
class ConnectionInUse {
 public:
  ConnectionInUse() = default;
  explicit ConnectionInUse(int fd) noexcept { Note(fd); }
  ~ConnectionInUse() { Forget(); }
  ConnectionInUse(const ConnectionInUse&) = delete;
  ConnectionInUse& operator=(const ConnectionInUse&) = delete;
  // Records `fd` instead of what was recorded before (-1: nothing).
  void Note(int fd) noexcept;
  void Forget() noexcept;

 private:
  uint64_t id_ = 0;  // 0: nothing recorded
};

// Closes every kept connection (tests; a process that turns warm connections off).
void CloseWarmConnections() noexcept;

// The fork handlers' (core/process_state.cc): the pool's fork lock before a
// fork, released after it in the parent; in the child, the copies closed and
// the pool emptied.
void WarmConnectionsPrepareFork() noexcept;
void WarmConnectionsParentAfterFork() noexcept;
void WarmConnectionsAfterForkInChild() noexcept;

// What the pool did so far, for tests and the open's debug line.
struct WarmConnectionStats {
  size_t kept = 0;       // connections in the pool now
  size_t reused = 0;     // fetches that took a kept connection
  size_t discarded = 0;  // kept connections found hung up or holding something, given up
  size_t evicted = 0;    // closed past the bounds
};
WarmConnectionStats WarmConnectionStatsNow() noexcept;

}  // namespace vmmipc::transport
