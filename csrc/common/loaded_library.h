// Whether a shared library is loaded in this process, by a part of its file
// name, read from the loader's own list (dl_iterate_phdr: no file access, no
// allocation). The answer is kept until the loader's counts of loads and
// unloads change, so asking again costs one callback.
#pragma once

#include <atomic>
#include <cstdint>

namespace vmmipc {

class LoadedLibraryProbe {
 public:
  // `name_part`: a string literal, looked for in each loaded object's path.
  explicit constexpr LoadedLibraryProbe(const char* name_part) : name_part_(name_part) {}

  bool Loaded();

 private:
  const char* name_part_;
  // The loader's counts when last looked and the answer then, in one word
  // (loaded_library.cc); 0: never looked. One atomic: no lock a fork could
  // find held, and no answer ever paired with the wrong counts.
  std::atomic<uint64_t> last_{0};
};

}  // namespace vmmipc
