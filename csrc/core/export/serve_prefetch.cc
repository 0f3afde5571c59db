// Prefetch's exporter half: after a request's run is granted and held, the
// other runs this process handed out handles for, sent in the same reply to
// an importer that asked (core/prefetch.h; docs/protocol.md, "Prefetch").
#include <algorithm>

#include "core/export/serving.h"
#include "core/prefetch.h"
#include "core/stats.h"
#include "transport/wire.h"

namespace vmmipc::core {

void PrefetchRuns(ExportSide& exporter, Serving* serving) {
  const transport::ServeRequest& request = serving->request;
  if (!request.prefetch || !PrefetchOn() || request.follower == 0 || serving->run.empty()) return;
  const ledger::VmmMapping& first = serving->run.front();
  const ledger::VmmMapping& last = serving->run.back();
  // A reply that fits one message stays one message (it is sent on the poll
  // thread and keeps its connection warm).
  const size_t room = serving->run.size() < transport::wire::kMaxChunksPerBatch
                          ? transport::wire::kMaxChunksPerBatch - serving->run.size()
                          : 0;
  ledger::PrefetchAsk ask;
  ask.follower = request.follower;
  ask.device = first.device;  // the handle's rank slot: the importer places them alike
  ask.skip_base = first.base;
  ask.skip_end = last.base + last.size;
  ask.max_chunks = std::min(room, kMaxPrefetchChunksPerReply);
  ask.max_bytes = kMaxPrefetchBytesPerReply;
  if (ask.max_chunks == 0) return;
  for (ledger::PrefetchRun& run : exporter.mappings().TakePrefetch(ask)) {
    for (size_t i = 0; i < run.chunks.size(); ++i) {
      transport::ChunkGrant grant;
      grant.address = run.chunks[i].base;
      grant.size = run.chunks[i].size;
      grant.generation = run.chunks[i].generation;
      grant.fd = std::move(run.fds[i]);
      grant.region_base = run.chunks[i].region_base;
      grant.run_start = i == 0;
      serving->reply.prefetched.push_back(std::move(grant));
    }
  }
  stats::Count(stats::Counter::kChunksPrefetchedOut, serving->reply.prefetched.size());
}

}  // namespace vmmipc::core
