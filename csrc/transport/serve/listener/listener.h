// Listener: the exporter's side of the fd protocol. One per process, started by
// core on the first VMM export (never at load). One poll thread accepts
// connections and reads their requests, many at once and without blocking, so
// that a silent or slow peer delays nobody else; it checks the peer's uid
// (SO_PEERCRED) and the request's MAC (proof the peer holds a handle this
// process made, unedited: its capability). It also answers them when the reply
// is one message (a thread hand-off costs a wake-up per open); longer replies,
// whose sends may wait on a peer that does not read, go to a small pool of
// workers (started as needed, up to max_workers), as do tasks posted with
// Post(). Answering asks the handler for the chunks and sends them back in
// batches with their fds (SCM_RIGHTS), MAC'd so the client knows it talks to
// the real exporter. No thread needs a CUDA context of its own (core's handler
// sets what it needs). Every socket wait is bounded by the timeout; the kernel
// is asked to refuse fds sent to us (SO_PASSRIGHTS). The handler runs on the
// poll thread: a driver call that hangs there holds up every peer.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "transport/serve/listener/listener_options.h"
#include "transport/serve/watch/watchers.h"

namespace vmmipc::transport {

struct ListenerImpl;  // listener_impl.h: the state its parts share

class Listener {
 public:
  // Binds the socket and starts the serving thread. Returns nullptr and fills
  // `error` when the socket cannot be bound (the name is taken, no fds...).
  static std::unique_ptr<Listener> Start(const ListenerOptions& options, ServeHandler handler,
                                         std::string* error);
  ~Listener();  // stops the thread and closes the socket
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  // The fork handlers' (core/process_state.cc): before a fork, takes the watch
  // list's lock (Watchers::PrepareFork); after it, releases it in the parent.
  void PrepareFork() noexcept;
  void ParentAfterFork() noexcept;
  // In a forked child: the thread does not exist there. Closes the socket fd
  // and forgets the thread without joining it; the object may then be leaked.
  void AbandonAfterFork() noexcept;

  const std::string& address() const;  // for logs: "@vmmipc.<uid>.i<instance>" or a path

  // Runs `task` once on a worker thread, in the order posted with requests
  // (for example, exporting a chunk ahead of the first request for it).
  void Post(std::function<void()> task);

  // Sends events to the importers that watch this process and waits for
  // their acks, at most `timeout` (watchers.h). Empty result without watchers.
  NotifyResult Notify(const std::vector<WatchNotice>& notices, Timeout timeout);
  // Tells the importers that asked for announcements that `announce`'s
  // handle was handed out; never waits (Watchers::Announce). How many were
  // sent it; 0 without watchers.
  size_t Announce(const WatchAnnounce& announce) noexcept;

 private:
  explicit Listener(std::unique_ptr<ListenerImpl> impl);
  std::unique_ptr<ListenerImpl> impl_;
};

}  // namespace vmmipc::transport
