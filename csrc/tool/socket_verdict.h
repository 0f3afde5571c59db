// Whether the sockets vmmipc would use in this environment can be used, as
// the library decides (transport/socket_address.h): an abstract name in the
// network namespace, or a file in VMMIPC_SOCKET_DIR, which must be private to
// the user, writable, and short enough for every exporter's socket path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace vmmipc::tool {

struct SocketVerdict {
  bool abstract = true;
  std::string dir;      // VMMIPC_SOCKET_DIR; empty for abstract names
  std::string pattern;  // "@vmmipc.<uid>.i<instance>" or "<dir>/vmmipc.<uid>.i<instance>.sock"
  std::string network_namespace;  // "net:[4026531840]", or "unknown"
  uint32_t uid = 0;
  uint32_t name_uid = 0;  // the uid in the names: as the parent user namespace sees `uid`
  bool usable = false;
  // Empty when usable; else one of missing, not_directory, not_private,
  // not_writable, too_long (directories), bind_failed (abstract names),
  // overflow_uid (either: the process runs as the overflow uid).
  std::string problem;
  std::string why;  // the reason, as the library words it, the directory's name left out
  size_t longest_path =
      0;  // usable directory: bytes of the longest path (every exporter's is as long)
  size_t path_limit = 0;  // the bytes a socket path may have
};

// The verdict for the sockets of `uid` with VMMIPC_SOCKET_DIR `socket_dir`.
// Abstract names are tried: one is bound (and closed) in this process.
SocketVerdict JudgeSockets(const std::string& socket_dir, uint32_t uid);

}  // namespace vmmipc::tool
