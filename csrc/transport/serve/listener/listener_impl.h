// ListenerImpl, the state the listener's parts share (internal to the
// transport layer): its lifecycle (listener.cc: start, stop, a forked
// child's walk-away), the poll thread's loop (listener_poll.cc: accepting
// connections and reading their requests), its admission (admission.h:
// which accepted connections may wait for their request) and the worker
// pool (listener_workers.h). What happens on one connection is
// serve_connection.h's. listener.h holds only a pointer to it.
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <array>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/scoped_fd.h"
#include "transport/serve/listener/admission.h"
#include "transport/serve/listener/listener_options.h"
#include "transport/serve/listener/listener_workers.h"
#include "transport/serve/listener/socket_file.h"
#include "transport/serve/serve_connection.h"
#include "transport/serve/watch/watchers.h"
#include "transport/socket_address.h"
#include "transport/socket_io.h"

namespace vmmipc::transport {

struct ListenerImpl {
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
  Admission admission{&context, &watchers, &workers};  // the poll thread's
  pid_t owner_pid = 0;          // getpid() at Start(): who may join the threads and unlink the path
  BoundSocketFile socket_file;  // a filesystem socket's file: removed at Stop() and at exit
  ListenerWorkers workers;      // send the long replies, run the posted tasks

  // Every exit path of Start() and of the Listener ends here.
  ~ListenerImpl() { Stop(); }

  // listener.cc: after the socket is bound, the stop fd, the context, the
  // budget, and the poll thread. False with `*error` filled.
  bool StartServing(std::string* error);
  void Stop() noexcept;
  void Abandon() noexcept;

  // listener_poll.cc, the poll thread's.
  void Run() noexcept;
  bool BuildPollSet(const std::array<pollfd, 2>& fixed, std::vector<pollfd>* pfds, size_t* kept_fds,
                    size_t* watch_fds) noexcept;
  void ReadWaiting(const std::vector<pollfd>& pfds, bool polled) noexcept;
  void AcceptQueued() noexcept;
  void AcceptFailed(int error) noexcept;
  void ReadKept(std::span<const pollfd> pfds, bool polled) noexcept;
  bool ReadAndAnswer(Connection& c) noexcept;
  void Answer(PendingRequest request) noexcept;
};

}  // namespace vmmipc::transport
