// Where an exporter listens: the one rule that turns (uid, pid, socket_dir)
// into a Unix socket address, shared by the listener and the client so that
// both always compute the same bytes. Owns naming only; no socket calls.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <cstdint>
#include <string>

namespace vmmipc::transport {

struct SocketAddress {
  sockaddr_un sockaddr{};
  socklen_t length = 0;  // exact: abstract names are length-delimited, not NUL-terminated
  bool abstract = true;
  std::string path;     // the filesystem path; empty for an abstract name
  std::string display;  // for logs: "@vmmipc.<uid>.<pid>" or the path

  const struct sockaddr* get() const { return reinterpret_cast<const struct sockaddr*>(&sockaddr); }
};

// "vmmipc.<uid>.<pid>": the name both kinds of address are built from.
std::string SocketBaseName(uint32_t uid, uint32_t pid);

// Empty socket_dir: the abstract name "\0vmmipc.<uid>.<pid>" (lives in the
// caller's network namespace). Otherwise "<socket_dir>/vmmipc.<uid>.<pid>.sock".
// Returns false and fills `error` when the path does not fit in sun_path.
bool MakeSocketAddress(uint32_t uid, uint32_t pid, const std::string& socket_dir,
                       SocketAddress* out, std::string* error);

}  // namespace vmmipc::transport
