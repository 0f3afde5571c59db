// The listening socket's making: socket, a stale path cleared, fchmod before
// bind, bind, SO_PASSRIGHTS off, listen.
#include "transport/serve/listener/listener_socket.h"

#include <dirent.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <string_view>

#include "common/log.h"
#include "common/syscall.h"
#include "transport/socket_io.h"
#include "transport/socket_uid.h"

namespace vmmipc::transport {
namespace {

constexpr int kBacklog = 256;

void (*g_bound_hook)(const std::string& path) = nullptr;

// A ".bind" file (a listener's name while it starts: BindListeningSocket)
// older than this is a leftover of a process killed between its bind and
// its link: swept like a dead socket. A start spends microseconds there.
constexpr int kStaleBindSeconds = 60;

// What one connect without waiting says of a socket file: a non-blocking
// Unix connect answers at once, connected (or queued) by a listener,
// EAGAIN when that listener's backlog is full (live, and busy: before, a
// blocking probe waited there for the whole sweep's time), ECONNREFUSED
// when nobody listens.
enum class Probe { kLive, kDead, kUnknown };

Probe ProbeSocketFile(const SocketAddress& address, int* error) {
  ScopedFd probe(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!probe) {
    *error = errno;
    return Probe::kUnknown;
  }
  if (::connect(probe.get(), address.get(), address.length) == 0 || errno == EAGAIN ||
      errno == EINPROGRESS)
    return Probe::kLive;
  *error = errno;
  return errno == ECONNREFUSED ? Probe::kDead : Probe::kUnknown;
}

// Prepares a filesystem socket path: a socket file left by a dead process
// (connect is refused) is removed; a live one, or any other kind of file, is
// left alone and reported.
bool ClearStalePath(const SocketAddress& address, std::string* error) {
  struct stat st {};
  if (::lstat(address.path.c_str(), &st) != 0) {
    if (errno == ENOENT) return true;
    *error = fmt::format("cannot inspect {}: {}", address.path, ErrnoText(errno));
    return false;
  }
  if (!S_ISSOCK(st.st_mode)) {
    *error = fmt::format("{} exists and is not a socket; not removing it", address.path);
    return false;
  }
  int probe_error = 0;
  const Probe probe = ProbeSocketFile(address, &probe_error);
  if (probe == Probe::kLive) {
    *error = fmt::format(
        "{} is in use by a live listener (another process of this uid with the same "
        "instance id: one chance in 2^32 a pair)",
        address.path);
    return false;
  }
  if (probe != Probe::kDead) {
    *error =
        fmt::format("{} exists and cannot be probed: {}", address.path, ErrnoText(probe_error));
    return false;
  }
  // ECONNREFUSED: nobody listens; a process of this name died without
  // unlinking. Its file would make bind() fail with EADDRINUSE.
  if (::unlink(address.path.c_str()) != 0 && errno != ENOENT) {
    *error = fmt::format("cannot remove stale socket {}: {}", address.path, ErrnoText(errno));
    return false;
  }
  VMMIPC_LOG_INFO("listener: removed stale socket file {}", address.path);
  return true;
}

// Removes the socket files of this uid in the listener's directory that
// nobody listens on: exporters killed without an exit handler. A name is an
// exporter's random instance id, which no later process takes, so such a file
// would otherwise stay for good. Only "vmmipc.<uid>.i<8 hex>.sock" sockets of
// our uid, refused at connect (a live listener accepts, or has a full
// backlog; either is left), and "vmmipc.<uid>.i<8 hex>.bind" ones as well
// once older than kStaleBindSeconds (a process killed between bind and link
// left it: nobody else ever removes it), and only while the path still names
// the inode looked at. Each probe is one connect that does not wait
// (ProbeSocketFile), so a busy listener costs the sweep no more than a dead
// one; the whole is bounded too: the first 1024 entries, and 100 ms.
void SweepDeadSocketFiles(const SocketAddress& own) {
  const size_t slash = own.path.rfind('/');
  if (slash == std::string::npos) return;
  const std::string dir = slash == 0 ? "/" : own.path.substr(0, slash);
  const std::string prefix = fmt::format("vmmipc.{}.i", SocketNameUid(::geteuid()));
  DIR* listing = ::opendir(dir.c_str());
  if (listing == nullptr) return;
  size_t seen = 0;
  const Deadline deadline = Deadline::AfterMs(100);
  while (const dirent* entry = ::readdir(listing)) {
    if (++seen > 1024 || deadline.Expired()) break;
    const std::string_view name(entry->d_name);
    if (name.size() != prefix.size() + 8 + 5 || name.substr(0, prefix.size()) != prefix) continue;
    const std::string_view suffix = name.substr(name.size() - 5);
    const bool bind_file = suffix == ".bind";
    if (suffix != ".sock" && !bind_file) continue;
    const std::string path = (dir == "/" ? dir : dir + "/") + std::string(name);
    if (path == own.path) continue;
    struct stat before {};
    if (::lstat(path.c_str(), &before) != 0 || !S_ISSOCK(before.st_mode) ||
        before.st_uid != ::geteuid())
      continue;
    if (bind_file && before.st_mtime > ::time(nullptr) - kStaleBindSeconds) continue;  // starting
    SocketAddress address = own;
    std::memcpy(address.sockaddr.sun_path, path.c_str(), path.size() + 1);
    int probe_error = 0;
    if (ProbeSocketFile(address, &probe_error) != Probe::kDead) continue;
    struct stat now {};
    if (::lstat(path.c_str(), &now) != 0 || now.st_dev != before.st_dev ||
        now.st_ino != before.st_ino || ::unlink(path.c_str()) != 0)
      continue;
    VMMIPC_LOG_INFO("listener: removed stale socket file {}{}", path,
                    bind_file ? " (left by a listener killed while it started)" : "");
  }
  ::closedir(listing);
}

bool Bind(const SocketAddress& address, int fd, std::string* error) {
  if (::bind(fd, address.get(), address.length) == 0) return true;
  const int e = errno;
  if (e == EADDRINUSE && address.abstract) {
    *error = fmt::format(
        "listener {}: the name is already bound by another process of this uid in this "
        "network namespace (an instance id taken twice, one chance in 2^32 a pair, or a "
        "process of this uid holding the name)",
        address.display);
  } else {
    *error = fmt::format("listener {}: bind: {}", address.display, ErrnoText(e));
  }
  return false;
}

}  // namespace

bool BindListeningSocket(const SocketAddress& address, ScopedFd* fd, BoundSocketFile* file,
                         std::string* error) {
  fd->Reset(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!*fd) {
    *error = fmt::format("listener {}: socket: {}", address.display, ErrnoText(errno));
    return false;
  }
  if (!address.abstract && !ClearStalePath(address, error)) return false;
  if (!address.abstract) SweepDeadSocketFiles(address);
  // The file bind() creates takes the socket's own mode (minus the umask):
  // set here, it is 0600 from birth. A chmod by path after bind would follow
  // a symlink swapped in meanwhile. The uid check is the real one anyway.
  if (!address.abstract && ::fchmod(fd->get(), 0600) != 0) {
    *error = fmt::format("listener {}: fchmod: {}", address.display, ErrnoText(errno));
    return false;
  }
  // A filesystem socket is bound under a name of the same length that no
  // sweep looks at (".bind" for ".sock") and gets its own name only once it
  // listens: a file under a listener's name is always one that accepts, so
  // another process's sweep (which removes files whose connect is refused)
  // never takes the file of a listener that is starting. A process killed in
  // between leaves the ".bind" file: the next start of that name clears it,
  // and any start in the directory sweeps it once it is a minute old.
  SocketAddress bound = address;
  if (!address.abstract) {
    bound.path.replace(bound.path.size() - 5, 5, ".bind");
    std::memcpy(bound.sockaddr.sun_path, bound.path.c_str(), bound.path.size() + 1);
    if (::unlink(bound.path.c_str()) != 0 && errno != ENOENT) {
      *error = fmt::format("cannot remove {}: {}", bound.path, ErrnoText(errno));
      return false;
    }
  }
  if (!Bind(bound, fd->get(), error)) return false;
  if (g_bound_hook != nullptr && !address.abstract) g_bound_hook(address.path);
  // Nothing we are sent may carry fds: have the kernel refuse them outright
  // where it can (Linux 6.16+); elsewhere serve_connection never takes them.
  const bool refuses_fds = RefuseIncomingFds(fd->get());
  VMMIPC_LOG_DEBUG("listener {}: SO_PASSRIGHTS {}", address.display,
                   refuses_fds ? "off: the kernel refuses fds sent to us" : "not supported");
  if (::listen(fd->get(), kBacklog) != 0) {
    *error = fmt::format("listener {}: listen: {}", address.display, ErrnoText(errno));
    if (!address.abstract) (void)::unlink(bound.path.c_str());
    return false;
  }
  if (address.abstract) return true;
  // The socket's own name, without replacing anything put there meanwhile
  // (link fails with EEXIST where rename would replace).
  const bool named = ::link(bound.path.c_str(), address.path.c_str()) == 0;
  const int link_error = errno;
  (void)::unlink(bound.path.c_str());
  if (!named) {
    *error =
        fmt::format("listener {}: naming the socket: {}", address.display, ErrnoText(link_error));
    return false;
  }
  // From here the file is removed at the listener's Stop() (its start's
  // failures included) and at the process's exit, while it is still the one bound.
  if (!file->Adopt(address.path))
    VMMIPC_LOG_WARN(
        "listener {}: the socket file is not the one bind() made any more; it is left "
        "alone, at stop and at exit",
        address.display);
  return true;
}

void SetBoundHookForTesting(void (*hook)(const std::string& path)) { g_bound_hook = hook; }

}  // namespace vmmipc::transport
