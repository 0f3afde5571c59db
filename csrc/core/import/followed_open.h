// Follow's part in one open (VMMIPC_FOLLOW=1): the watch connection it may
// ask for, and its place among the opens in flight, from before the fetch
// until, under its placement lock, it takes the events that arrived meanwhile
// (ledger/in_flight_opens.h). Both end on every path.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <optional>

#include "core/import/import_side.h"
#include "core/import/opening.h"

namespace vmmipc::core {

class FollowedOpen {
 public:
  FollowedOpen(ImportSide& importer, const ledger::Vmm2Handle& handle);
  ~FollowedOpen();
  FollowedOpen(const FollowedOpen&) = delete;
  FollowedOpen& operator=(const FollowedOpen&) = delete;

  uint32_t follower() const { return follower_; }
  bool watch() const { return watch_; }

  // catch up: under the placement lock, in one hold of the import lock,
  // either the pointer of the same handle opened by another thread while
  // this one fetched (`*reopened`), or the open's run after the pauses and
  // resumes of its exporter since the fetch began (open->run, its fds and
  // generations). A failure when more events came than the log holds, or
  // when the exporter stopped following this process meanwhile.
  CUresult CatchUp(Opening* open, std::optional<uint64_t>* reopened);

 private:
  ImportSide& importer_;
  ledger::ExporterId exporter_;
  uint32_t follower_ = 0;
  bool watch_ = false;
  uint64_t in_flight_ = 0;
};

}  // namespace vmmipc::core
