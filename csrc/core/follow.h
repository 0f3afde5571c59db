// Follow (VMMIPC_FOLLOW=1): importers follow a memory saver's pause and
// resume of memory they opened. A pause is cuMemUnmap (+ cuMemRelease) of an
// exported chunk with its address range kept; a resume is cuMemCreate +
// cuMemMap of new memory at the same address. The exporter's hooks tell the
// importers that were granted the chunk, over the watch connection each
// importer keeps to it, and wait (bounded) until they have unmapped it too
// (so the memory is really freed) or mapped the new memory at the same
// importer address (so their pointers, and CUDA graphs over them, stay
// valid). docs/protocol.md, "Follow", has the exchange; docs/architecture.md
// the rules (what an importer that touches paused memory gets, importers
// that are gone). On by default: without it an importer keeps the memory its
// exporter unmaps. This is the exporter's half; the importer's is
// core/import/follow_import.h.
#pragma once

#include <cstdint>

#include "core/process_state.h"
#include "ledger/vmm_mappings.h"

namespace vmmipc::core {

// Exporter. The cuMemUnmap hook, with the records it took out and before
// the driver unmaps: tells the importers that hold them, waits for them.
void FollowUnmap(ProcessState& state, const ledger::TakenMappings& taken);
// The cuMemMap hook, once `mapping` (with its generation) is recorded: when
// importers followed a pause of a chunk at the same base, sends them the new
// memory and waits until they mapped it.
void FollowMap(ProcessState& state, const ledger::VmmMapping& mapping);
// The cuMemUnmap hook, once the driver unmapped `taken`, whatever the
// setting: chunks granted to importers that do not follow them (their
// VMMIPC_FOLLOW=0, an older vmmipc, or this process's VMMIPC_FOLLOW=0) stay
// allocated for as long as those importers map them, and they never see a
// resume. Counted (unfollowed_unmaps, unfollowed_bytes), and said once per
// process at warning level: who, how many bytes, what to set.
void SayUnfollowedUnmap(const ledger::TakenMappings& taken);

}  // namespace vmmipc::core
