// What the exporter's side of the protocol asks of the process it serves:
// the request it hands on (who asks, for which handle), the reply it expects
// (chunks with their fds, or a refusal), the handler that turns one into the
// other, and the observers told what was done (for counters). The listener
// (listener.h) takes these from its user, and serve_connection.h uses them on
// each connection; neither needs the other's header for them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "transport/chunk_grant.h"

namespace vmmipc::transport {

struct ServeRequest {
  uint32_t peer_pid = 0;  // from SO_PEERCRED (in the listener's pid namespace)
  uint32_t peer_uid = 0;
  uint64_t address = 0;     // the exporter address the handle was made for
  uint64_t chunk_base = 0;  // base of the chunk holding `address`, as get saw it
  uint32_t generation = 0;  // that chunk's generation as get saw it
  bool watch = false;       // the importer asks to keep the connection for events
  uint32_t follower = 0;    // the importer's follower id (follow), 0 if it does not follow
  bool announce = false;    // with watch: the importer asks to be sent announcements
};

struct ServeReply {
  RefuseReason refuse = RefuseReason::kNone;
  std::string detail;              // for the exporter's log line only; not sent
  std::vector<ChunkGrant> chunks;  // from the chunk holding `address` to the end of the run
};

using ServeHandler = std::function<ServeReply(const ServeRequest&)>;

// Optional observers of what the listener did, for counters. Plain function
// pointers: called on the listener thread, must not block or throw.
struct ListenerEvents {
  void (*refused)(RefuseReason reason) = nullptr;  // every refusal sent
  void (*granted)(size_t chunks) = nullptr;        // a grant fully sent, with its fds
  void (*dropped)() = nullptr;                     // a connection closed without an answer
  void (*reaped)() = nullptr;  // a connection that may hold a peer's fds, closed off-thread
};

}  // namespace vmmipc::transport
