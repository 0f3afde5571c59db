// Where an exporter listens: the one rule that turns (uid, pid, socket_dir)
// into a Unix socket address, shared by the listener and the client so that
// both always compute the same bytes, and the one check that a socket
// directory is private to the user. No socket calls.
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
// Naming only: looks at nothing on disk.
bool NameSocketAddress(uint32_t uid, uint32_t pid, const std::string& socket_dir,
                       SocketAddress* out, std::string* error);

// Whether `dir` may hold the sockets of `uid`: a directory (symlinks to one
// are followed) owned by `uid` and writable by neither group nor others. In
// any other directory another user could create names in it first: squat a
// listener's name, or plant a socket an importer connects to. The sticky bit
// does not help: it stops removing others' names, not creating new ones.
// Fills `error` with the reason when not.
bool CheckSocketDir(const std::string& dir, uint32_t uid, std::string* error);

// What the listener and the client use: NameSocketAddress, then, for a
// filesystem socket, CheckSocketDir(socket_dir, uid). `uid` is the caller's
// effective uid.
bool MakeSocketAddress(uint32_t uid, uint32_t pid, const std::string& socket_dir,
                       SocketAddress* out, std::string* error);

}  // namespace vmmipc::transport
