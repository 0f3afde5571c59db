// CheckGrants (grant_check.h).
#include "transport/serve/grant_check.h"

#include <algorithm>
#include <utility>

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

RefuseReason CheckPrefetched(const std::vector<ChunkGrant>& chunks,
                             std::vector<ChunkGrant>* prefetched, std::string* why) {
  if (prefetched->empty()) return RefuseReason::kNone;
  if (chunks.size() + prefetched->size() > wire::kMaxTotalChunks) {
    *why = fmt::format("{} chunks with the prefetched ones, the protocol allows {}",
                       chunks.size() + prefetched->size(), wire::kMaxTotalChunks);
    return RefuseReason::kTooManyChunks;
  }
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // [address, end) of everything granted
  for (const ChunkGrant& c : chunks) ranges.emplace_back(c.address, c.address + c.size);
  for (size_t i = 0; i < prefetched->size(); ++i) {
    const ChunkGrant& c = (*prefetched)[i];
    const ChunkGrant* previous = i > 0 ? &(*prefetched)[i - 1] : nullptr;
    if (!c.fd.valid() || c.size == 0 || c.address + c.size < c.address ||
        (!c.run_start && (previous == nullptr || previous->address + previous->size != c.address ||
                          previous->region_base != c.region_base))) {
      *why = fmt::format("the handler prefetched an invalid chunk at {:#x} (size {}, fd {})",
                         c.address, c.size, c.fd.get());
      return RefuseReason::kInternal;
    }
    ranges.emplace_back(c.address, c.address + c.size);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i - 1].second > ranges[i].first) {
      *why = fmt::format("the handler prefetched a chunk at {:#x} that overlaps another",
                         ranges[i].first);
      return RefuseReason::kInternal;
    }
  }
  return RefuseReason::kNone;
}

}  // namespace vmmipc::transport
