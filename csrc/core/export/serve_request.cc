// Serving one request of a peer: the steps of core/export/serving.h in
// order, and what is counted and logged of a request served.
#include "core/export/serve_request.h"

#include <string>

#include "common/elapsed.h"
#include "common/log.h"
#include "core/export/export_ahead.h"
#include "core/export/exported_fds.h"
#include "core/export/serving.h"
#include "core/stats.h"
#include "transport/socket_io.h"

namespace vmmipc::core {

bool Refuse(Serving* serving, transport::RefuseReason reason, std::string detail) {
  serving->reply.chunks.clear();
  serving->reply.refuse = reason;
  serving->reply.detail = std::move(detail);
  return false;
}

// The wire names no offset: an importer maps each chunk's fd from offset 0 of
// its allocation. A chunk mapped at another offset (today's driver refuses
// such a cuMemMap; the simulator and a later driver may not) would put other
// bytes at its place in the run, so the whole request is refused: callers add
// offsets within the run, and a run silently cut short before that chunk
// would fault later, far from the cause.
bool RefuseOffset(Serving* serving, uint64_t chunk_base, uint64_t offset) {
  return Refuse(serving, transport::RefuseReason::kExportFailed,
                fmt::format("chunk 0x{:x} of the run is mapped at offset 0x{:x} of its "
                            "allocation; vmmipc shares chunks mapped from offset 0 only",
                            chunk_base, offset));
}

transport::ServeReply Serve(const transport::ServeRequest& request) {
  const auto start = SteadyClock::now();
  ExportSide& exporter = Exporter();
  // The peer imports what this answers right after: the background export
  // pauses while it is served and for a while after (background_export.h).
  BusyScope busy(BackgroundIfOn());
  UseExportContext(exporter);
  Serving serving(request);
  SnapshotRun(exporter, &serving);
  const bool served = !serving.run.empty() ? CheckRun(&serving) && GrantRun(exporter, &serving) &&
                                                 HoldRun(exporter, &serving)
                                           : DescribeRun(&serving);
  if (!served) return std::move(serving.reply);  // nothing of it is sent (counted when sent)
  stats::Count(stats::Counter::kRequestsServed);
  stats::Count(stats::Counter::kChunksServed, serving.reply.chunks.size());
  VMMIPC_LOG_DEBUG("served 0x{:x} to {}: {} chunks in {} us", request.address,
                   transport::PeerPidText(request.peer_pid), serving.reply.chunks.size(),
                   MicrosSince(start));
  return std::move(serving.reply);
}

}  // namespace vmmipc::core
