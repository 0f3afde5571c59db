// Listener::Impl, the state the listener's parts share (internal to the
// transport layer): its lifecycle (listener.cc: start, stop, a forked
// child's walk-away), the poll thread's loop (listener_poll.cc: accepting
// connections and reading their requests), the connection budget
// (listener_admission.cc: which accepted connections may wait for their
// request) and the worker pool (listener_workers.h). What happens on one
// connection is serve_connection.h's.
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/scoped_fd.h"
#include "transport/serve/fd_budget.h"
#include "transport/serve/listener.h"
#include "transport/serve/listener_workers.h"
#include "transport/serve/serve_connection.h"
#include "transport/serve/socket_file.h"
#include "transport/serve/watchers.h"
#include "transport/socket_address.h"
#include "transport/socket_io.h"

namespace vmmipc::transport {

struct Listener::Impl {
  ListenerOptions options;
  ServeHandler handler;
  ServeContext context;  // shared by the poll thread and the workers; set before they start
  Watchers watchers;     // kept watch connections (options.keep_watchers)
  SocketAddress address;
  ScopedFd listen_fd;
  ScopedFd stop_fd;  // eventfd: readable once Stop() wrote it, and stays so
  // Heap-held so that a forked child can leak it: destroying a joinable
  // std::thread calls std::terminate, and joining a thread that does not
  // exist in the child would hang.
  std::unique_ptr<std::thread> thread;
  // The poll thread's: connections accepted whose request is not read yet,
  // how many of them are our uid's and other uids', what the host's fds
  // allow of each class (fd_budget.h), until when accept() rests, and
  // whether it ran out of fds last time (the caps were cut to what was free
  // then: the first accept that works again measures afresh).
  std::vector<Connection> waiting;
  // Connections of our importers kept after their reply for their next
  // request (warm connections): within the budget's cap, kMaxKeptPerPeer per
  // peer process, each at most kKeptIdleMs idle.
  std::vector<Connection> kept;
  size_t own_waiting = 0;
  size_t others_waiting = 0;
  FdBudget budget;
  Deadline accept_resume = Deadline::AfterMs(0);
  bool out_of_fds = false;
  pid_t owner_pid = 0;          // getpid() at Start(): who may join the threads and unlink the path
  BoundSocketFile socket_file;  // a filesystem socket's file: removed at Stop() and at exit
  ListenerWorkers workers;      // send the long replies, run the posted tasks

  // Every exit path of Start() and of the Listener ends here.
  ~Impl() { Stop(); }

  // listener.cc: after the socket is bound, the stop fd, the context, the
  // budget, and the poll thread. False with `*error` filled.
  bool StartServing(std::string* error);
  void Stop() noexcept;
  void Abandon() noexcept;

  // listener_poll.cc, the poll thread's.
  void Run() noexcept;
  void ReadWaiting(const std::vector<pollfd>& pfds, bool polled) noexcept;
  void AcceptQueued() noexcept;
  void AcceptFailed(int error) noexcept;
  void ReadKept(std::span<const pollfd> pfds, bool polled) noexcept;
  void Answer(PendingRequest request) noexcept;
  void Keep(ScopedFd fd, const PeerCredentials& peer) noexcept;

  // listener_admission.cc, the poll thread's too.
  void Admit(Connection connection) noexcept;
  std::string OverCap(uint32_t uid) const;
  size_t Held() const noexcept;
  void MeasureBudget(bool out_of_fds) noexcept;
  bool RefreshBudget() noexcept;
};

}  // namespace vmmipc::transport
