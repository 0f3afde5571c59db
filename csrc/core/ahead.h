// Ahead (VMMIPC_AHEAD=1 with follow): an exporter announces each handle its
// application hands out to the importers that follow it and asked; an
// importer's worker advances each announced run to mapped in its
// application's gaps, so that the application's open of it is a lookup
// (docs/protocol.md, "Announcements"; core/import/ahead.h). Its bounds, and
// whether it is on. The exporter's half is core/export/announce.cc.
#pragma once

#include <cstddef>
#include <cstdint>

#include "config/params.h"

namespace vmmipc::core {

// Importer, per exporter: at most this many chunks and bytes mapped ahead of
// the application's opens; announcements past them are opened when the
// application opens them.
inline constexpr size_t kMaxAheadChunksPerExporter = 256;
inline constexpr uint64_t kMaxAheadBytesPerExporter = uint64_t{256} << 30;

// Ahead rides on follow: its announcements come over the watch connection,
// and the follow events drop what was mapped ahead when the exporter unmaps
// it. Without follow the setting does nothing (one warning at start,
// core/process_state.cc).
inline bool AheadOn() {
  const config::Params& params = config::Get();
  return params.ahead && params.follow;
}

}  // namespace vmmipc::core
