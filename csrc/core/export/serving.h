// One request of a peer served as named steps over one struct, as the open
// is (core/import/opening.h). Memory the cuMemMap hook recorded: snapshot
// (the run from the mapping table), check (the handle's generation, the run
// cut at its region and bounded, offsets), grant (each chunk's fd through the
// exported-fd cache), hold (the last check that nothing of the run was
// unmapped meanwhile, recording the follower). Memory vmmipc did not see
// mapped: describe (the driver, chunk by chunk, each exported) instead.
// Each step fills in its part of `Serving` and returns false when it ends the
// serving there, `reply` then holding the refusal; core/export/serve_request.cc
// runs them in that order. No step takes a lock of the export side's own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/export/export_side.h"
#include "ledger/vmm_mappings.h"
#include "transport/serve/serve_handler.h"

namespace vmmipc::core {

// More chunks than this in one run is refused rather than sending an
// unbounded stream of fds (64 Ki chunks of 2 MiB is already 128 GiB).
constexpr size_t kMaxChunksPerRun = 65536;

struct Serving {
  explicit Serving(const transport::ServeRequest& r) : request(r) {}
  const transport::ServeRequest& request;
  // snapshot, then check: the tracked run from the handle's chunk (empty:
  // memory vmmipc did not see mapped)
  std::vector<ledger::VmmMapping> run;
  // grant (or describe): each chunk with its fd; a refusal when a step ended it
  transport::ServeReply reply;
};

// Ends the serving with a refusal: nothing granted so far is sent (the fds
// close here). Returns false, for the steps to return.
bool Refuse(Serving* serving, transport::RefuseReason reason, std::string detail);
// The wire names no offset: a chunk mapped at another offset of its
// allocation refuses the whole request (serve_request.cc says why).
bool RefuseOffset(Serving* serving, uint64_t chunk_base, uint64_t offset);

// snapshot: the run from the handle's chunk in the table of own mappings, one
// more chunk than the bound (so that check can refuse a run too long).
void SnapshotRun(ExportSide& exporter, Serving* serving);
// check: the handle's chunk is the one mapped now (its generation), the run
// ends at its region and is not too long, and every chunk is mapped from
// offset 0: all before any fd is exported for it.
bool CheckRun(Serving* serving);
// grant: an fd per chunk, a dup of the exported-fd cache's or one export
// that is cached.
bool GrantRun(ExportSide& exporter, Serving* serving);
// hold: nothing of the run was unmapped or re-created since the snapshot
// (the unmap hook takes a record out before the driver unmaps), so every
// chunk granted is of the generation the snapshot saw; with follow, records
// the requester as a holder of each chunk in the same step.
bool HoldRun(ExportSide& exporter, Serving* serving);

// describe: memory vmmipc did not see mapped (made before it was loaded),
// described by the driver, exported per request, and re-checked chunk by
// chunk at the end.
bool DescribeRun(Serving* serving);

}  // namespace vmmipc::core
