// Small process facts the unit tests check leaks and timing with.
#pragma once

#include <dirent.h>

#include <chrono>

namespace vmmipc::testing {

// Open descriptors of this process (the directory's own fd included).
inline int FdCount() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int count = 0;
  while (readdir(dir) != nullptr) ++count;
  closedir(dir);
  return count;
}

inline long ElapsedMs(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               start)
      .count();
}

}  // namespace vmmipc::testing
