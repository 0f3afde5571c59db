// Naming of exporter sockets. The uid is part of the name so that two users
// whose processes happen to share a pid (separate pid namespaces, one network
// namespace) never collide, and a squatter must at least guess it.
#include "transport/socket_address.h"

#include <fmt/format.h>

#include <cstddef>
#include <cstring>

namespace vmmipc::transport {

std::string SocketBaseName(uint32_t uid, uint32_t pid) {
  return fmt::format("vmmipc.{}.{}", uid, pid);
}

bool MakeSocketAddress(uint32_t uid, uint32_t pid, const std::string& socket_dir,
                       SocketAddress* out, std::string* error) {
  *out = SocketAddress{};
  out->sockaddr.sun_family = AF_UNIX;
  const std::string base = SocketBaseName(uid, pid);
  if (socket_dir.empty()) {
    // Abstract namespace: a leading NUL, then the name without terminator; the
    // kernel compares (length, bytes), so the length must be exact.
    static_assert(sizeof(out->sockaddr.sun_path) > 64, "sun_path too small");
    out->sockaddr.sun_path[0] = '\0';
    std::memcpy(out->sockaddr.sun_path + 1, base.data(), base.size());
    out->length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + base.size());
    out->abstract = true;
    out->display = "@" + base;
    return true;
  }
  std::string dir = socket_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  std::string path = (dir == "/" ? dir : dir + "/") + base + ".sock";
  if (path.size() + 1 > sizeof(out->sockaddr.sun_path)) {
    if (error != nullptr) {
      *error = fmt::format("socket path '{}' is {} bytes, longer than the {} a Unix socket allows",
                           path, path.size(), sizeof(out->sockaddr.sun_path) - 1);
    }
    return false;
  }
  std::memcpy(out->sockaddr.sun_path, path.c_str(), path.size() + 1);
  out->length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
  out->abstract = false;
  out->path = path;
  out->display = std::move(path);
  return true;
}

}  // namespace vmmipc::transport
