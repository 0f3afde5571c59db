// The uid an exporter's socket is named by: the process's effective uid as
// its parent user namespace sees it. In a rootless container (podman, docker
// rootless, `unshare --user --map-root-user`) a process is uid 0 to itself
// and uid 1000 (its user) to the host; naming by the uid each side sees of
// itself would give the container's exporter "@vmmipc.0..." and the host's
// importer "@vmmipc.1000...". The parent namespace's view is the same for
// both. SO_PEERCRED needs no such care: the kernel maps the peer's uid into
// the receiver's namespace (docs/security.md#user-namespaces).
#pragma once

#include <cstdint>
#include <string_view>

namespace vmmipc::transport {

// `uid` through the lines of a /proc/<pid>/uid_map ("inside outside count"),
// read by the process itself: the uid of the parent user namespace. `uid`
// itself when no line maps it (a map that could not be read: no /proc).
uint32_t ParentNamespaceUid(uint32_t uid, std::string_view uid_map);

// ParentNamespaceUid(uid, this process's /proc/self/uid_map). Reads the file
// once per distinct uid asked about (a process's user namespace is set
// before it runs us; a later unshare changes its euid too, and so misses the
// cache). `uid` itself when the file cannot be read.
uint32_t SocketNameUid(uint32_t uid);

// The kernel's overflow uid (/proc/sys/kernel/overflowuid; 65534 where it
// cannot be read), read once: what SO_PEERCRED and stat() report for a uid
// that has no mapping in the reader's user namespace, and what a process's
// own euid reads as in a user namespace without a uid_map (`unshare --user`).
// It names no one: in such a namespace every other user's process reads as
// it too. So it is never "our uid": an exporter running as it does not serve
// (listener.cc), an importer never takes a listener of that uid for its own
// (fetch_client.cc), nor a socket directory of that owner (socket_address.cc).
uint32_t OverflowUid();
inline bool IsOverflowUid(uint32_t uid) { return uid == OverflowUid(); }

// The overflow uid from the text of /proc/sys/kernel/overflowuid; 65534
// when it is not a number (tests).
uint32_t ParseOverflowUid(std::string_view text);

}  // namespace vmmipc::transport
