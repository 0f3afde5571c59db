// The exporter's check of what its handler granted, before any of it is sent:
// chunks there, not too many for the protocol, each with an fd and a size
// that does not wrap, none overlapping another; sorted by address on the way.
#pragma once

#include <string>
#include <vector>

#include "transport/chunk_grant.h"

namespace vmmipc::transport {

// kNone when `*chunks` can be sent as is (now in address order); else the
// refusal to send instead, and `*why` for the exporter's log line.
RefuseReason CheckGrants(std::vector<ChunkGrant>* chunks, std::string* why);
// The prefetched runs (prefetch) beside the checked `chunks`: each run starts
// with a run_start chunk and continues contiguously, every chunk valid, none
// overlapping another or the handle's run, and all of them together within
// the protocol's bound. Kept in the handler's order (run by run).
RefuseReason CheckPrefetched(const std::vector<ChunkGrant>& chunks,
                             std::vector<ChunkGrant>* prefetched, std::string* why);

}  // namespace vmmipc::transport
