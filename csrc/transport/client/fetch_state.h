// The state one fetch's steps share (fetch_client.cc: connect, request,
// hand-over; fetch_reply.cc: the reply's batches), internal to the client.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/elapsed.h"
#include "transport/client/fetch_client.h"
#include "transport/client/warm_connections.h"
#include "transport/reaper/fd_reaper.h"
#include "transport/socket_address.h"
#include "transport/socket_io.h"
#include "transport/wire.h"

namespace vmmipc::transport::fetch_internal {

// One fetch's state, from the first step to the hand-over.
struct Fetch {
  Fetch(const FetchRequest& r, const ClientOptions& o)
      : request(r),
        options(o),
        timeout_ms(o.timeout.ms()),
        deadline(Deadline::AfterMs(timeout_ms)) {}
  // Whatever the fetch's end: the chunks of the batches received so far go
  // to the reaper, and so does the connection with anything still queued
  // on it (an unverified answer's fds), unless the hand-over took them.
  ~Fetch() {
    for (ChunkGrant& chunk : chunks) CloseInBackground(std::move(chunk.fd));
    CloseConnection(std::move(sock));
  }
  Fetch(const Fetch&) = delete;
  Fetch& operator=(const Fetch&) = delete;

  const FetchRequest& request;
  const ClientOptions& options;
  const SteadyClock::time_point start = SteadyClock::now();
  const int timeout_ms;
  // The one bound of the whole exchange: connect, send and every receive
  // wait against it, so that a slow peer cannot stretch it step by step.
  const Deadline deadline;
  const uint32_t uid = ::geteuid();
  SocketAddress address;
  ScopedFd sock;
  // `sock` while this fetch uses it: a child forked meanwhile closes its copy.
  ConnectionInUse in_use;
  // The request goes on a kept connection (warm_connections.h), and whether
  // that connection turned out dead before any answer came (its exporter
  // closed it just before our request): then the fetch connects afresh once.
  bool reused = false;
  bool warm_lost = false;
  SteadyClock::time_point connected;
  SipKey key;                // the handle's: MACs the request and every answer
  wire::Nonce nonce{};       // this exchange's: every answer must carry it
  uint32_t total = 0;        // chunks in the reply, as its batch 0 says
  uint32_t batch_count = 1;  // batches in the reply, as its batch 0 says
  std::vector<ChunkGrant> chunks;
};

// A step's verdict: empty when the fetch goes on, else how it ends (a
// failure, or the exporter's refusal).
using Ended = std::optional<FetchResult>;

FetchResult Fail(FetchStatus status, std::string detail);
// Maps a socket-level failure while talking to the exporter.
FetchResult IoFailure(const IoResult& io, const std::string& what, const Fetch& fetch);

// Every batch of the reply, in order (batch 0 says how many there are), then
// the chunks in address order, none overlapping another (fetch_reply.cc).
Ended ReceiveReply(Fetch& fetch);

}  // namespace vmmipc::transport::fetch_internal
