// The listener's admission: the connections accepted whose request is not
// read yet, counted by class (our uid's, other uids' together, each other
// uid's), the connections kept after a reply for their importer's next
// request, whether a reply may wait for a worker, the caps the host's free
// fds set for each class (fd_budget.h), measured again when a class is full,
// and when accept() may run again after it failed. The poll thread's only
// (listener_poll.cc); the newest connection past a cap is closed at once, a
// reply past the queue's cap refused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "transport/serve/fd_budget.h"
#include "transport/serve/listener/listener_workers.h"
#include "transport/serve/serve_connection.h"
#include "transport/serve/watch/watchers.h"
#include "transport/socket_io.h"

namespace vmmipc::transport {

class Admission {
 public:
  // `context`, `watchers` and `workers` (the listener's) outlive this object.
  Admission(const ServeContext* context, Watchers* watchers,
            const ListenerWorkers* workers) noexcept
      : context_(context), watchers_(watchers), workers_(workers) {}

  // A connection that must wait for its request, if its class has room; the
  // newest of a full class is closed at once.
  void Admit(Connection connection) noexcept;
  // Empty when a connection of `uid` may wait; else why not, for the log line.
  std::string OverCap(uint32_t uid) const;
  // Keeps `fd`, whose reply went out whole, for its importer's next request
  // (warm connections) within the kept connections' cap and kMaxKeptPerPeer
  // for its peer process; else closes it (the importer connects again).
  void Keep(ScopedFd fd, const PeerCredentials& peer) noexcept;
  // Whether a reply holding `fds` fds (its connection and chunks) may wait
  // for a worker: always when none waits, else within the queue's cap; else
  // false, with why not in `*why` for the refusal.
  bool MayQueue(size_t fds, std::string* why) noexcept;
  // The fds the listener holds: waiting, kept and watch connections, and
  // the replies queued for a worker.
  size_t Held() const noexcept;
  void MeasureBudget(bool out_of_fds) noexcept;
  bool RefreshBudget() noexcept;

  // The poll thread's, read and written by its loop directly: connections
  // accepted whose request is not read yet, how many of them are our uid's
  // and other uids', what the host's fds allow of each class, until when
  // accept() rests, and whether it ran out of fds last time (the caps were
  // cut to what was free then: the first accept that works again measures
  // afresh).
  std::vector<Connection> waiting;
  // Connections of our importers kept after their reply for their next
  // request: each at most kKeptIdleMs idle (the poll loop closes it then).
  std::vector<Connection> kept;
  size_t own_waiting = 0;
  size_t others_waiting = 0;
  FdBudget budget;
  Deadline accept_resume = Deadline::AfterMs(0);
  bool out_of_fds = false;

 private:
  const ServeContext* context_;
  Watchers* watchers_;
  const ListenerWorkers* workers_;
};

}  // namespace vmmipc::transport
