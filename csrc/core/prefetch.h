// Prefetch (VMMIPC_PREFETCH=1 with VMMIPC_FOLLOW=1): an importer's fetch also
// brings the fds of other runs its exporter handed out handles for, so that
// the open of one of their handles needs no round trip (docs/protocol.md,
// "Prefetch"; docs/security.md says what it widens). Its bounds, and whether
// it is on; the exporter's half is core/export/serve_prefetch.cc, the
// importer's core/import/ahead/import_prefetch.cc (kept, taken, dropped) and
// core/import/ahead/import_ahead.cc (VMMIPC_PREFETCH=2); map ahead
// (VMMIPC_PREFETCH=3) is core/export/announce.cc and core/import/ahead/ahead_opens.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "config/params.h"

namespace vmmipc::core {

// Exporter, per reply: at most this many chunks and bytes of other runs (and
// never so many that a one-message reply needs a second).
inline constexpr size_t kMaxPrefetchChunksPerReply = 64;
inline constexpr uint64_t kMaxPrefetchBytesPerReply = uint64_t{64} << 30;
// Importer, per exporter: at most this many prefetched fds and bytes kept
// (ledger/prefetched_fds.h); runs past them are fetched when opened.
inline constexpr size_t kMaxPrefetchedFdsPerExporter = 256;
inline constexpr uint64_t kMaxPrefetchedBytesPerExporter = uint64_t{256} << 30;

// Prefetch takes effect only with follow, whose events drop what was
// prefetched when its exporter unmaps it; without follow the setting does
// nothing (one warning at start, core/process_state.cc).
inline bool PrefetchOn() {
  const config::Params& params = config::Get();
  return params.prefetch != 0 && params.follow;
}
// VMMIPC_PREFETCH=2 (importer): kept chunks are imported into the driver on
// a thread of the import side's ahead of their open (core/import/ahead/import_ahead.cc).
inline bool ImportAheadOn() { return PrefetchOn() && config::Get().prefetch == 2; }
// VMMIPC_PREFETCH=3, map ahead: an exporter announces each handle it hands
// out to the importers that follow it and asked (over their watch
// connections); an importer opens announced handles ahead of its
// application on a thread (core/import/ahead/ahead_opens.h, open_ahead.cc), so
// that the application's open of one is a table lookup. Both sides set it.
inline bool MapAheadOn() { return PrefetchOn() && config::Get().prefetch == 3; }

}  // namespace vmmipc::core
