// The importer's half of follow (VMMIPC_FOLLOW=1; core/follow.h has the
// whole): the follower id its requests carry, the watch connection an open
// asks for and keeps, and (on the follow thread) what it does with its
// exporters' pauses and resumes.
#pragma once

#include <cstdint>

#include "core/import/import_side.h"
#include "transport/client/watch_client.h"

namespace vmmipc::core {

// The tag of an exporter's watch connection (ImportFollow, WatchClient).
inline uint64_t WatchTag(const ledger::ExporterId& exporter) {
  return (uint64_t{exporter.pid} << 32) | (exporter.instance & 0xFFFFFFFFu);
}
// Makes the context the follow thread uses (the importer's, from its first
// kept watch connection) current on this thread, once per thread.
void UseFollowContext(const ImportSide& importer);
// The follower id its requests carry: 0 with follow off.
uint32_t FollowerId(ImportSide& importer);
// True when this open should ask exporter (pid, instance) for a watch
// connection: follow is on, none is kept, and no other open is asking (one
// that is, is waited for). A true answer is followed by EndWatch.
bool StartWatch(ImportSide& importer, uint32_t pid, uint32_t instance);
void EndWatch(ImportSide& importer, uint32_t pid, uint32_t instance);
// Keeps the watch connection an open brought back (starts the follow thread
// on first use). Failures are logged: that exporter is then not followed.
void KeepWatch(ImportSide& importer, uint32_t pid, uint32_t instance,
               transport::WatchConnection connection);

}  // namespace vmmipc::core
