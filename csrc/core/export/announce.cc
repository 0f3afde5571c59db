// The exporter's announcement of a handle it handed out (announce.h).
#include "core/export/announce.h"

#include <cstring>

#include "core/export/export_side.h"
#include "core/stats.h"
#include "transport/serve/watch/watchers.h"

namespace vmmipc::core {

void AnnounceHandle(ExportSide& exporter, const ledger::Vmm2Handle& handle,
                    const unsigned char bytes[ledger::kHandleSize]) {
  static_assert(transport::wire::kAnnouncedHandleSize == ledger::kHandleSize);
  transport::WatchAnnounce announce;
  announce.base = handle.chunk_base;
  announce.size = handle.chunk_size;
  announce.generation = handle.generation;
  std::memcpy(announce.handle.data(), bytes, ledger::kHandleSize);
  const size_t sent = exporter.listener().Announce(announce);
  if (sent != 0) stats::Count(stats::Counter::kAnnouncementsSent, sent);
}

}  // namespace vmmipc::core
