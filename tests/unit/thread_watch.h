// What the unit tests look at in this process's other threads: whether one
// sleeps (blocked at a hold point), how many carry a name, and a bounded
// wait for a condition that another thread makes true.
#pragma once

#include <dirent.h>
#include <sys/types.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>

namespace vmmipc::testing {

// Whether thread `tid` of this process sleeps (blocked: a futex wait).
inline bool Sleeps(pid_t tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  return paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] == 'S';
}

// How many threads of this process are named `name`.
inline int ThreadsNamed(const std::string& name) {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return -1;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream in(std::string("/proc/self/task/") + e->d_name + "/comm");
    std::string comm;
    std::getline(in, comm);
    n += comm == name;
  }
  closedir(d);
  return n;
}

// Whether `done()` holds within 10 s, looked at every millisecond.
template <typename Done>
bool Eventually(Done done) {
  for (int i = 0; i < 10000; ++i) {
    if (done()) return true;
    usleep(1000);
  }
  return false;
}

}  // namespace vmmipc::testing
