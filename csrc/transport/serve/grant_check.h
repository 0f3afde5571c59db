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

}  // namespace vmmipc::transport
