// LoadedLibraryProbe: dl_iterate_phdr over the loaded objects, cached by the
// loader's counts.
#include "common/loaded_library.h"

#include <link.h>

#include <cstddef>
#include <cstring>

namespace vmmipc {
namespace {

// The loader's counts of loads and unloads, from the first object's callback
// (every object sees the same counts), packed with room for the answer in bit
// 0: loads << 32 | unloads << 1 (each cut to its low bits: a cache key, and
// the main program counts as a load, so never 0).
int ReadCounts(dl_phdr_info* info, size_t size, void* data) {
  if (size < offsetof(dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs)) return 1;
  *static_cast<uint64_t*>(data) = (static_cast<uint64_t>(info->dlpi_adds & 0xffffffffu) << 32) |
                                  (static_cast<uint64_t>(info->dlpi_subs & 0x7fffffffu) << 1);
  return 1;  // one object is enough
}

struct Search {
  const char* name_part;
  bool found = false;
};

int FindName(dl_phdr_info* info, size_t, void* data) {
  auto* search = static_cast<Search*>(data);
  if (info->dlpi_name != nullptr && std::strstr(info->dlpi_name, search->name_part) != nullptr) {
    search->found = true;
    return 1;
  }
  return 0;
}

}  // namespace

bool LoadedLibraryProbe::Loaded() {
  uint64_t counts = 0;
  dl_iterate_phdr(ReadCounts, &counts);
  // Counts of 0 (a loader that does not keep them) never match what was kept.
  const uint64_t last = last_.load(std::memory_order_relaxed);
  if (counts != 0 && (last & ~uint64_t{1}) == counts) return (last & 1) != 0;
  Search search{name_part_};
  dl_iterate_phdr(FindName, &search);
  last_.store(counts | (search.found ? 1 : 0), std::memory_order_relaxed);
  return search.found;
}

}  // namespace vmmipc
