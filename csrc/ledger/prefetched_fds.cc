// PrefetchedFds (prefetched_fds.h): an ordered map of chunks per exporter.
#include "ledger/prefetched_fds.h"

#include <fcntl.h>

#include <iterator>

namespace vmmipc::ledger {

bool PrefetchedFds::Keep(const ExporterId& exporter, std::vector<PrefetchedChunk>* run) {
  if (run->empty()) return false;
  static const OfExporter kNone;
  auto found = exporters_.find(exporter);
  const OfExporter& kept = found != exporters_.end() ? found->second : kNone;
  uint64_t bytes = 0;
  for (const PrefetchedChunk& chunk : *run) {
    bytes += chunk.size;
    // Overlaps a kept chunk: the one before it, or one starting inside it.
    auto next = kept.chunks.lower_bound(chunk.address);
    if (next != kept.chunks.end() && next->first < chunk.address + chunk.size) return false;
    if (next != kept.chunks.begin() &&
        std::prev(next)->second.address + std::prev(next)->second.size > chunk.address)
      return false;
  }
  if (kept.chunks.size() + run->size() > max_fds_ || kept.bytes + bytes > max_bytes_) return false;
  OfExporter& of = exporters_[exporter];
  for (PrefetchedChunk& chunk : *run) {
    chunk.serial = next_serial_++;
    of.chunks.emplace(chunk.address, std::move(chunk));
  }
  of.bytes += bytes;
  run->clear();
  return true;
}

std::vector<PrefetchedChunk> PrefetchedFds::TakeRun(const ExporterId& exporter, uint64_t base,
                                                    uint64_t size, uint32_t generation,
                                                    uint64_t region_base) {
  auto of = exporters_.find(exporter);
  if (of == exporters_.end()) return {};
  std::map<uint64_t, PrefetchedChunk>& chunks = of->second.chunks;
  auto first = chunks.find(base);
  if (first == chunks.end() || first->second.size != size ||
      first->second.generation != generation || first->second.region_base != region_base)
    return {};
  const uint64_t run_end = first->second.run_end;
  auto it = first;
  uint64_t at = base;
  while (it != chunks.end() && it->first == at && it->second.run_end == run_end && at < run_end) {
    at += it->second.size;
    ++it;
  }
  if (at != run_end) return {};  // a chunk of the run was dropped: the open fetches it
  std::vector<PrefetchedChunk> run;
  for (auto take = first; take != it;) {
    of->second.bytes -= take->second.size;
    run.push_back(std::move(take->second));
    take = chunks.erase(take);
  }
  if (chunks.empty()) exporters_.erase(of);
  return run;
}

bool PrefetchedFds::Drop(const ExporterId& exporter, uint64_t base,
                         std::vector<PrefetchedChunk>* dropped) {
  auto of = exporters_.find(exporter);
  if (of == exporters_.end()) return false;
  auto it = of->second.chunks.find(base);
  if (it == of->second.chunks.end()) return false;
  of->second.bytes -= it->second.size;
  dropped->push_back(std::move(it->second));
  of->second.chunks.erase(it);
  if (of->second.chunks.empty()) exporters_.erase(of);
  return true;
}

size_t PrefetchedFds::DropExporter(const ExporterId& exporter,
                                   std::vector<PrefetchedChunk>* dropped) {
  auto of = exporters_.find(exporter);
  if (of == exporters_.end()) return 0;
  const size_t count = of->second.chunks.size();
  for (auto& [address, chunk] : of->second.chunks) dropped->push_back(std::move(chunk));
  exporters_.erase(of);
  return count;
}

size_t PrefetchedFds::DropAll(std::vector<PrefetchedChunk>* dropped) {
  size_t count = 0;
  for (auto& [exporter, of] : exporters_) {
    count += of.chunks.size();
    for (auto& [address, chunk] : of.chunks) dropped->push_back(std::move(chunk));
  }
  exporters_.clear();
  return count;
}

bool PrefetchedFds::NextToImport(ExporterId* exporter, uint64_t* address, uint64_t* serial,
                                 ScopedFd* fd) {
  // From the highest address down: opens tend to come in the order the
  // handles were made (ascending), so the two meet once instead of both
  // importing the same chunk (the open would, as it never waits).
  for (auto& [id, of] : exporters_)
    for (auto it = of.chunks.rbegin(); it != of.chunks.rend(); ++it) {
      const uint64_t at = it->first;
      PrefetchedChunk& chunk = it->second;
      if (chunk.import_tried) continue;
      chunk.import_tried = true;
      ScopedFd copy(::fcntl(chunk.fd.get(), F_DUPFD_CLOEXEC, 0));
      if (!copy.valid()) continue;  // out of fds: the open imports it
      *exporter = id;
      *address = at;
      *serial = chunk.serial;
      *fd = std::move(copy);
      return true;
    }
  return false;
}

bool PrefetchedFds::Imported(const ExporterId& exporter, uint64_t address, uint64_t serial,
                             uint64_t handle) {
  auto of = exporters_.find(exporter);
  if (of == exporters_.end()) return false;
  auto it = of->second.chunks.find(address);
  if (it == of->second.chunks.end() || it->second.serial != serial) return false;
  it->second.imported = handle;
  return true;
}

size_t PrefetchedFds::fd_count() const {
  size_t count = 0;
  for (const auto& [exporter, of] : exporters_) count += of.chunks.size();
  return count;
}

}  // namespace vmmipc::ledger
