// The uid of socket names, from the process's uid_map, and the overflow uid
// (socket_uid.h).
#include "transport/socket_uid.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <string>

#include "common/scoped_fd.h"

namespace vmmipc::transport {
namespace {

// The kernel's default, where /proc/sys/kernel/overflowuid cannot be read.
constexpr uint32_t kDefaultOverflowUid = 65534;

// One whitespace-separated unsigned number from `text` at `*at`.
bool NextNumber(std::string_view text, size_t* at, uint64_t* out) {
  while (*at < text.size() && (text[*at] == ' ' || text[*at] == '\t')) ++*at;
  const char* first = text.data() + *at;
  const auto [end, error] = std::from_chars(first, text.data() + text.size(), *out);
  if (error != std::errc() || end == first) return false;
  *at += static_cast<size_t>(end - first);
  return true;
}

}  // namespace

uint32_t ParentNamespaceUid(uint32_t uid, std::string_view uid_map) {
  size_t line_start = 0;
  while (line_start < uid_map.size()) {
    size_t line_end = uid_map.find('\n', line_start);
    if (line_end == std::string_view::npos) line_end = uid_map.size();
    const std::string_view line = uid_map.substr(line_start, line_end - line_start);
    size_t at = 0;
    uint64_t inside = 0, outside = 0, count = 0;
    if (NextNumber(line, &at, &inside) && NextNumber(line, &at, &outside) &&
        NextNumber(line, &at, &count) && uid >= inside && uid - inside < count) {
      const uint64_t mapped = outside + (uid - inside);
      if (mapped <= UINT32_MAX) return static_cast<uint32_t>(mapped);
    }
    line_start = line_end + 1;
  }
  return uid;
}

uint32_t SocketNameUid(uint32_t uid) {
  // The last answer, uid << 32 | mapped, so that an open does not read /proc
  // each time. It starts at uid 0xffffffff, (uid_t)-1, which no process has.
  static std::atomic<uint64_t> last{uint64_t{0xffffffffu} << 32};
  const uint64_t known = last.load(std::memory_order_relaxed);
  if (static_cast<uint32_t>(known >> 32) == uid) return static_cast<uint32_t>(known);
  ScopedFd file(::open("/proc/self/uid_map", O_RDONLY | O_CLOEXEC));
  if (!file.valid()) return uid;
  // Usually one line; the kernel allows 340, of at most 32 bytes each.
  std::string map;
  char buffer[1024];
  ssize_t got;
  while (map.size() < 16384 && (got = ::read(file.get(), buffer, sizeof(buffer))) > 0)
    map.append(buffer, static_cast<size_t>(got));
  if (map.empty()) return uid;
  const uint32_t mapped = ParentNamespaceUid(uid, map);
  last.store(uint64_t{uid} << 32 | mapped, std::memory_order_relaxed);
  return mapped;
}

uint32_t ParseOverflowUid(std::string_view text) {
  size_t at = 0;
  uint64_t uid = 0;
  if (!NextNumber(text, &at, &uid) || uid > UINT32_MAX) return kDefaultOverflowUid;
  return static_cast<uint32_t>(uid);
}

uint32_t OverflowUid() {
  // -1 until read. Read once: the sysctl is set at boot, if ever.
  static std::atomic<int64_t> known{-1};
  if (const int64_t uid = known.load(std::memory_order_relaxed); uid >= 0)
    return static_cast<uint32_t>(uid);
  uint32_t uid = kDefaultOverflowUid;
  ScopedFd file(::open("/proc/sys/kernel/overflowuid", O_RDONLY | O_CLOEXEC));
  if (file.valid()) {
    char buffer[32];
    const ssize_t got = ::read(file.get(), buffer, sizeof(buffer));
    if (got > 0) uid = ParseOverflowUid(std::string_view(buffer, static_cast<size_t>(got)));
  }
  known.store(uid, std::memory_order_relaxed);
  return uid;
}

}  // namespace vmmipc::transport
