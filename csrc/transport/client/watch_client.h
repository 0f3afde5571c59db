// WatchClient: the importer's side of follow. It holds one watch connection
// per exporter (kept after a fetch that asked for it, fetch_client.h) and one
// thread that reads their events, hands each to the handler (core: unmap on
// a pause, map the new memory on a resume) and sends the handler's answer
// back as the ack. The thread starts with the first connection (never at
// load); a connection whose exporter hung up, or that sends anything out of
// protocol, is closed and forgotten (a later open asks for a new one).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "common/scoped_fd.h"
#include "common/timeout.h"
#include "transport/client/fetch_client.h"
#include "transport/wire.h"

namespace vmmipc::transport {

// `exporter` is the tag given to Add; `fd` is the new memory's fd on a resume
// (invalid on a pause). A kUnfollowed event also comes from the client itself
// when it closes a connection whose exporter sent something out of protocol.
// A kAnnounce (a connection whose fetch set ClientOptions::announce) carries
// the handle in event.handle; its handler returns at once (kDone, or
// kNotHeld to ignore it): the exporter reads its ack on its poll thread.
// Runs on the client's thread; must not throw.
using EventHandler =
    std::function<wire::AckStatus(uint64_t exporter, const wire::Event& event, ScopedFd fd)>;

// Told, on the client's thread after it forgot the connection, that the
// connection to `exporter` ended (its exporter hung up, or broke the
// protocol). Must not throw.
using EndedHandler = void (*)(uint64_t exporter);

class WatchClient {
 public:
  WatchClient(EventHandler handler, Timeout timeout, EndedHandler ended = nullptr);
  ~WatchClient();  // stops the thread, closes the connections
  WatchClient(const WatchClient&) = delete;
  WatchClient& operator=(const WatchClient&) = delete;

  // Keeps `connection` for the exporter tagged `exporter` (one per tag: a
  // second is closed). False, with `*error`, when the thread cannot start.
  bool Add(uint64_t exporter, WatchConnection connection, std::string* error);
  // True when a connection for `exporter` is kept.
  bool Has(uint64_t exporter) const;

  // The fork handlers' (core/process_state.cc): before a fork, takes the
  // connections' lock (waiting for its holder); after it, releases it in the parent.
  void PrepareFork() noexcept;
  void ParentAfterFork() noexcept;
  // In a forked child: forget the thread, close our copies of the
  // connections without shutting them down (they are the parent's too).
  void AbandonAfterFork() noexcept;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace vmmipc::transport
