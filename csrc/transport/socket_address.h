// Where an exporter listens: the one rule that turns (uid, owner, socket_dir)
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
  std::string display;  // for logs: "@vmmipc.<uid>.i<instance>" or the path

  const struct sockaddr* get() const { return reinterpret_cast<const struct sockaddr*>(&sockaddr); }
};

// Whose socket: an exporter process names its socket by its public instance
// id (random, in every handle since version 3), which no other process shares
// whatever pid namespace it runs in. Before version 3 the name was the pid,
// which repeats across pid namespaces (two containers' pid 2 on one host
// network): an importer still reaches such an exporter of an older vmmipc
// through the pid of its version 2 handle.
struct SocketOwner {
  uint32_t id = 0;
  bool by_pid = false;

  static SocketOwner Instance(uint32_t instance) { return {instance, false}; }
  static SocketOwner Pid(uint32_t pid) { return {pid, true}; }
};

// "vmmipc.<uid>.i<instance, 8 hex digits>", or "vmmipc.<uid>.<pid>" for an
// owner by pid: the name both kinds of address are built from. The two forms
// never coincide (a pid is decimal digits only).
std::string SocketBaseName(uint32_t uid, SocketOwner owner);

// Empty socket_dir: the abstract name "\0<base name>" (lives in the caller's
// network namespace). Otherwise "<socket_dir>/<base name>.sock". Returns
// false and fills `error` when the path does not fit in sun_path. Naming
// only: looks at nothing on disk.
bool NameSocketAddress(uint32_t uid, SocketOwner owner, const std::string& socket_dir,
                       SocketAddress* out, std::string* error);

// Whether `dir` may hold the sockets of `uid`: a directory (symlinks to one
// are followed) owned by `uid` and writable by neither group nor others. In
// any other directory another user could create names in it first: squat a
// listener's name, or plant a socket an importer connects to. The sticky bit
// does not help: it stops removing others' names, not creating new ones.
// Fills `error` with the reason when not.
bool CheckSocketDir(const std::string& dir, uint32_t uid, std::string* error);

// What the listener and the client use: NameSocketAddress by
// SocketNameUid(uid) (the uid of the parent user namespace: socket_uid.h),
// then, for a filesystem socket, CheckSocketDir(socket_dir, uid). `uid` is
// the caller's effective uid.
bool MakeSocketAddress(uint32_t uid, SocketOwner owner, const std::string& socket_dir,
                       SocketAddress* out, std::string* error);

}  // namespace vmmipc::transport
