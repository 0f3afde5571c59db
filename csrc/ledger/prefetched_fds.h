// PrefetchedFds: the fds an importer holds of runs its exporters sent ahead
// of their opens (prefetch, docs/protocol.md "Prefetch"), per exporter and
// bounded, until an open of one of their handles takes them, the exporter
// unmaps them (a follow event), its watch connection goes, or the process
// forks (in the child). No lock of its own: core/import/import_side.h says
// which guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "common/scoped_fd.h"
#include "ledger/import_table.h"

namespace vmmipc::ledger {

struct PrefetchedChunk {
  uint64_t address = 0;  // the chunk's base in the exporter
  uint64_t size = 0;
  uint32_t generation = 0;
  uint64_t region_base = 0;  // of its run, as a handle of it names it
  uint64_t run_end = 0;      // where the run it came in ends, in the exporter
  ScopedFd fd;
  // Import ahead: the driver's allocation handle of `fd`'s memory, imported
  // on the import side's thread (0: none; whoever takes the chunk releases it).
  uint64_t imported = 0;
  bool import_tried = false;  // picked by NextToImport once, whatever came of it
  uint64_t serial = 0;        // set by Keep: tells a chunk apart from a later one at its address
};

class PrefetchedFds {
 public:
  PrefetchedFds(size_t max_fds, uint64_t max_bytes) : max_fds_(max_fds), max_bytes_(max_bytes) {}

  // Keeps one run of `exporter` (contiguous chunks, run_end set) unless it
  // overlaps a chunk kept or passes the bounds: then false, and its fds stay
  // in `*run` for the caller to close.
  bool Keep(const ExporterId& exporter, std::vector<PrefetchedChunk>* run);
  // What an open of a handle of `exporter` at chunk `base` would fetch: the
  // chunks from `base` to its run's end, taken out, when the chunk at `base`
  // is of `generation`, `size` and `region_base` and every chunk to the
  // run's end is kept; else empty, nothing taken.
  std::vector<PrefetchedChunk> TakeRun(const ExporterId& exporter, uint64_t base, uint64_t size,
                                       uint32_t generation, uint64_t region_base);
  // Drops the chunk at `base` of `exporter` (whatever its generation), moved
  // to `*dropped` (its fd, and its imported handle to release); false when none is kept.
  bool Drop(const ExporterId& exporter, uint64_t base, std::vector<PrefetchedChunk>* dropped);
  // Drops everything of `exporter`; returns how many chunks.
  size_t DropExporter(const ExporterId& exporter, std::vector<PrefetchedChunk>* dropped);
  // Drops everything (a forked child's copies); returns how many chunks.
  size_t DropAll(std::vector<PrefetchedChunk>* dropped);
  // Import ahead: the next kept chunk never picked (the highest address
  // first), now picked, with a dup of its fd to import; false when there is none.
  bool NextToImport(ExporterId* exporter, uint64_t* address, uint64_t* serial, ScopedFd* fd);
  // Its import gave `handle`: kept with it when the chunk is still here
  // (same serial); false when it went meanwhile (the caller releases `handle`).
  bool Imported(const ExporterId& exporter, uint64_t address, uint64_t serial, uint64_t handle);
  size_t fd_count() const;

 private:
  struct OfExporter {
    std::map<uint64_t, PrefetchedChunk> chunks;  // by address
    uint64_t bytes = 0;
  };
  const size_t max_fds_;
  const uint64_t max_bytes_;
  std::map<ExporterId, OfExporter> exporters_;
  uint64_t next_serial_ = 1;
};

}  // namespace vmmipc::ledger
