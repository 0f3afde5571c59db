// The importer's side of the fd protocol: connect to the exporter named by a
// handle (pid), prove that we hold the handle (a MAC under its capability),
// check that the exporter proves it too, and collect every chunk grant with its fd. Nothing is returned
// unless every batch verified, so the caller never maps a squatter's memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "transport/chunk_grant.h"

namespace vmmipc::transport {

// Every field of the handle: the request repeats them, MAC'd under the
// handle's capability, which the exporter recomputes from them.
struct FetchRequest {
  uint32_t exporter_pid = 0;
  uint64_t capability = 0;
  uint64_t address = 0;
  uint64_t chunk_base = 0;
  uint64_t chunk_size = 0;
  uint64_t region_base = 0;
  uint32_t generation = 0;
  uint16_t rank_slot = 0;
};

struct ClientOptions {
  std::string socket_dir;  // empty: abstract socket
  int timeout_ms = 5000;   // bound on the whole exchange
};

enum class FetchStatus {
  kOk = 0,
  kNoExporter,     // nobody listens under that pid's name (exporter exited)
  kTimeout,        // a wait ran past the timeout
  kRefused,        // the exporter answered with a RefuseReason
  kUnauthentic,    // the answer's MAC did not verify: not the real exporter
  kProtocolError,  // malformed answer, wrong fd count, short message, peer hung up
  kNoResources,    // out of fds or memory on this side
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
};

FetchResult FetchChunks(const FetchRequest& request, const ClientOptions& options);

}  // namespace vmmipc::transport
