// CheckGrants (grant_check.h).
#include "transport/serve/grant_check.h"

#include <algorithm>

#include "common/log.h"
#include "transport/wire.h"

namespace vmmipc::transport {

RefuseReason CheckGrants(std::vector<ChunkGrant>* chunks, std::string* why) {
  if (chunks->empty()) {
    *why = "the handler granted no chunks";
    return RefuseReason::kInternal;
  }
  if (chunks->size() > wire::kMaxTotalChunks) {
    *why = fmt::format("{} chunks, the protocol allows {}", chunks->size(), wire::kMaxTotalChunks);
    return RefuseReason::kTooManyChunks;
  }
  std::sort(chunks->begin(), chunks->end(),
            [](const ChunkGrant& a, const ChunkGrant& b) { return a.address < b.address; });
  for (size_t i = 0; i < chunks->size(); ++i) {
    const ChunkGrant& c = (*chunks)[i];
    if (!c.fd.valid() || c.size == 0 || c.address + c.size < c.address) {
      *why = fmt::format("the handler granted an invalid chunk at {:#x} (size {}, fd {})",
                         c.address, c.size, c.fd.get());
      return RefuseReason::kInternal;
    }
    if (i > 0 && (*chunks)[i - 1].address + (*chunks)[i - 1].size > c.address) {
      *why = fmt::format("the handler granted overlapping chunks at {:#x} and {:#x}",
                         (*chunks)[i - 1].address, c.address);
      return RefuseReason::kInternal;
    }
  }
  return RefuseReason::kNone;
}

}  // namespace vmmipc::transport
