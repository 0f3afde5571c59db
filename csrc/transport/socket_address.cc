// Naming of exporter sockets, and the check of a socket directory. The uid is
// part of the name so that two users' exporters never collide, and the
// process's random instance id so that two exporters of one user never do,
// whatever pid namespaces they run in.
#include "transport/socket_address.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

#include "common/syscall.h"
#include "transport/socket_uid.h"

namespace vmmipc::transport {

std::string SocketBaseName(uint32_t uid, SocketOwner owner) {
  if (owner.by_pid) return fmt::format("vmmipc.{}.{}", uid, owner.id);
  return fmt::format("vmmipc.{}.i{:08x}", uid, owner.id);
}

bool NameSocketAddress(uint32_t uid, SocketOwner owner, const std::string& socket_dir,
                       SocketAddress* out, std::string* error) {
  *out = SocketAddress{};
  out->sockaddr.sun_family = AF_UNIX;
  const std::string base = SocketBaseName(uid, owner);
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

bool CheckSocketDir(const std::string& dir, uint32_t uid, std::string* error) {
  auto refuse = [&](const std::string& why) {
    if (error != nullptr) *error = fmt::format("socket directory '{}' {}", dir, why);
    return false;
  };
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0)
    return refuse(fmt::format("cannot be used: {}", ErrnoText(errno)));
  if (!S_ISDIR(st.st_mode)) return refuse("is not a directory");
  constexpr const char* kDo = "use a directory of your own that only you can write (mode 0700)";
  if (IsOverflowUid(uid)) {
    // Every unmapped user's directory reads as owned by it (socket_uid.h).
    return refuse(fmt::format(
        "cannot be told from another user's: this process runs as the overflow uid {} (a "
        "user namespace without a uid mapping); map the namespace's uid",
        uid));
  }
  if (st.st_uid != uid) {
    return refuse(fmt::format(
        "belongs to uid {}, not to this process's uid {}: its owner could create or remove "
        "socket names in it; {}",
        st.st_uid, uid, kDo));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    const char* who = (st.st_mode & S_IWGRP) && (st.st_mode & S_IWOTH) ? "group and others"
                      : (st.st_mode & S_IWOTH)                         ? "others"
                                                                       : "its group";
    return refuse(fmt::format(
        "is writable by {} (mode {:04o}): another user could create socket names in it before "
        "vmmipc (the sticky bit does not stop that); {}",
        who, st.st_mode & 07777, kDo));
  }
  return true;
}

bool MakeSocketAddress(uint32_t uid, SocketOwner owner, const std::string& socket_dir,
                       SocketAddress* out, std::string* error) {
  // Named by the uid the parent user namespace sees (socket_uid.h), so that
  // a rootless container's process and the host's agree; the directory's
  // owner is checked against the uid this process sees (stat maps it too).
  if (!NameSocketAddress(SocketNameUid(uid), owner, socket_dir, out, error)) return false;
  // Checked on every use, not once: the directory can change under a
  // long-running process, and a stat costs little next to a connection.
  return out->abstract || CheckSocketDir(socket_dir, uid, error);
}

}  // namespace vmmipc::transport
