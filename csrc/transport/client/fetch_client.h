// The importer's side of the fd protocol: connect to the exporter named by a
// handle (pid), prove that we hold the handle (a MAC under its capability),
// check that the exporter proves it too, and collect every chunk grant with its
// fd. Nothing is returned unless every batch verified, so the caller never maps
// a squatter's memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/scoped_fd.h"
#include "common/timeout.h"
#include "transport/chunk_grant.h"
#include "transport/siphash.h"
#include "transport/wire.h"

namespace vmmipc::transport {

// Every field of the handle: the request repeats them, MAC'd under the
// handle's capability, which the exporter recomputes from them.
struct FetchRequest {
  wire::HandleFields handle;
  uint64_t capability = 0;
  // The exporter's instance id, which names its socket (handles of version 3);
  // 0: its pid does (a version 2 handle, from an older vmmipc).
  uint32_t exporter_instance = 0;
};

struct ClientOptions {
  std::string socket_dir;  // empty: abstract socket
  Timeout timeout;         // bound on the whole exchange
  bool watch = false;      // ask the exporter to keep the connection for events (follow)
  uint32_t follower = 0;   // this importer's follower id (follow; required with watch)
  // Keep the connection after the fetch, and reuse a kept one, up to this
  // many in all (warm_connections.h); 0: a new connection per fetch.
  size_t warm_connections = 0;
  // With watch: ask the exporter to send announcements on the watch
  // connection (kRequestFlagAnnounce: the handles it hands out from then
  // on). An exporter that refuses the flag (an older vmmipc: kBadRequest) is
  // asked again without it, within the same deadline
  // (FetchResult::announce_refused); without watch the flag is not sent.
  bool announce = false;
};

// A connection kept after a fetch with ClientOptions::watch: the exporter
// sends events on it (watch_client.h), MAC'd under the request's key and nonce.
struct WatchConnection {
  ScopedFd fd;
  SipKey key;
  wire::Nonce nonce{};
};

// How a fetch ended, declared once: the enum and its log name come from this
// list. What each means to the library is core's: the CUresult an open returns
// (core/import/open_fetch.cc) and the VMMIPC_STATS counter of a failed open
// (core/stats.h), both switches that fail the build when a status is missing.
// X(enumerator, "name in log lines")
#define VMMIPC_FETCH_FAILURES(X)                                                    \
  /* Nobody listens under that pid's name (the exporter exited). */                 \
  X(kNoExporter, "no exporter")                                                     \
  /* A wait ran past the timeout. */                                                \
  X(kTimeout, "timeout")                                                            \
  /* The exporter answered with a RefuseReason. */                                  \
  X(kRefused, "refused")                                                            \
  /* The answer's MAC did not verify: not the exporter that made the handle. */     \
  X(kUnauthentic, "unauthentic")                                                    \
  /* A malformed answer, a wrong fd count, a short message, a peer that hung up. */ \
  X(kProtocolError, "protocol error")                                               \
  /* Out of fds or memory on this side. */                                          \
  X(kNoResources, "no resources")

enum class FetchStatus {
  kOk = 0,
#define VMMIPC_FETCH_ENUM(id, name) id,
  VMMIPC_FETCH_FAILURES(VMMIPC_FETCH_ENUM)
#undef VMMIPC_FETCH_ENUM
};
const char* FetchStatusName(FetchStatus status);

struct FetchResult {
  FetchStatus status = FetchStatus::kProtocolError;
  RefuseReason refuse = RefuseReason::kNone;  // when status == kRefused
  // The answer's MAC verified (always, for kOk). False for a kRefused with
  // kBadToken from a process that did not make this handle: no
  // answer from it can be verified (docs/protocol.md, "Unverified refusals").
  bool verified = false;
  std::string detail;              // one human sentence for the log line
  std::vector<ChunkGrant> chunks;  // when status == kOk, in address order
  WatchConnection watch;           // when status == kOk and options.watch
  // Where the exchange's time went, for the open's debug line (kOk only):
  // socket and connect, then the request sent until the answer is in hand.
  int64_t connect_us = 0;
  int64_t answer_us = 0;
  bool warm = false;  // the request went on a kept connection (warm_connections.h)
  // options.announce (with watch), and the exporter refused the flag as a
  // bad request: this is the answer to the request sent again without it.
  bool announce_refused = false;
};

FetchResult FetchChunks(const FetchRequest& request, const ClientOptions& options);

}  // namespace vmmipc::transport
