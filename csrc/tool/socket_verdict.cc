// The socket verdict, from the library's own naming rule and directory check
// (transport/socket_address.h), plus what a check can try beyond them: that
// an abstract name binds here, that the directory is writable, and that the
// path of the largest pid fits.
#include "tool/socket_verdict.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "common/log.h"
#include "common/scoped_fd.h"
#include "common/syscall.h"
#include "transport/socket_address.h"

namespace vmmipc::tool {
namespace {

std::string NetworkNamespace() {
  char link[64] = {};
  const ssize_t got = readlink("/proc/self/ns/net", link, sizeof(link) - 1);
  return got > 0 ? std::string(link, static_cast<size_t>(got)) : "unknown";
}

// The largest pid of this system (pid_max - 1), whose socket path is the longest.
uint32_t LargestPid() {
  constexpr uint32_t kPidMaxLimit = 4194304;  // the kernel's bound on 64-bit systems
  ScopedFd fd(open("/proc/sys/kernel/pid_max", O_RDONLY | O_CLOEXEC));
  char text[16] = {};
  if (!fd.valid() || read(fd.get(), text, sizeof(text) - 1) <= 0) return kPidMaxLimit - 1;
  const long pid_max = std::strtol(text, nullptr, 10);
  return pid_max > 1 && pid_max <= kPidMaxLimit ? static_cast<uint32_t>(pid_max - 1)
                                                : kPidMaxLimit - 1;
}

// The display of an address with its pid written as "<pid>".
std::string Pattern(const std::string& display, uint32_t pid) {
  std::string pattern = display;
  const std::string digits = "." + std::to_string(pid);
  const size_t at = pattern.rfind(digits);
  if (at != std::string::npos) pattern.replace(at, digits.size(), ".<pid>");
  return pattern;
}

// CheckSocketDir's error without its "socket directory '<dir>' " lead.
std::string Reason(const std::string& error, const std::string& dir) {
  const std::string lead = fmt::format("socket directory '{}' ", dir);
  return error.rfind(lead, 0) == 0 ? error.substr(lead.size()) : error;
}

void JudgeAbstract(SocketVerdict* verdict) {
  transport::SocketAddress address;
  std::string error;
  const uint32_t pid = static_cast<uint32_t>(getpid());
  if (!transport::NameSocketAddress(verdict->uid, pid, "", &address, &error)) {
    verdict->problem = "bind_failed";
    verdict->why = error;
    return;
  }
  verdict->pattern = Pattern(address.display, pid);
  // This process's own name: no other process uses it while this one lives.
  ScopedFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!sock.valid() || ::bind(sock.get(), address.get(), address.length) != 0) {
    verdict->problem = "bind_failed";
    verdict->why = fmt::format("an abstract Unix socket cannot be bound: {}", ErrnoText(errno));
    return;
  }
  verdict->usable = true;
}

void JudgeDirectory(SocketVerdict* verdict) {
  const std::string& dir = verdict->dir;
  std::string error;
  if (!transport::CheckSocketDir(dir, verdict->uid, &error)) {
    struct stat st {};
    verdict->problem = ::stat(dir.c_str(), &st) != 0 ? "missing"
                       : !S_ISDIR(st.st_mode)        ? "not_directory"
                                                     : "not_private";
    verdict->why = Reason(error, dir);
    return;
  }
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    verdict->problem = "not_writable";
    verdict->why = fmt::format("is not writable by uid {}: {}", verdict->uid, ErrnoText(errno));
    return;
  }
  // The longest path is the largest pid's: when it fits, every pid's does.
  const uint32_t largest = LargestPid();
  transport::SocketAddress address;
  if (!transport::NameSocketAddress(verdict->uid, largest, dir, &address, &error)) {
    verdict->problem = "too_long";
    verdict->why = error;
    if (transport::NameSocketAddress(verdict->uid, 1, dir, &address, nullptr))
      verdict->pattern = Pattern(address.path, 1);
    return;
  }
  verdict->longest_path = address.path.size();
  verdict->pattern = Pattern(address.path, largest);
  verdict->usable = true;
}

}  // namespace

SocketVerdict JudgeSockets(const std::string& socket_dir, uint32_t uid) {
  SocketVerdict verdict;
  verdict.abstract = socket_dir.empty();
  verdict.dir = socket_dir;
  verdict.uid = uid;
  verdict.network_namespace = NetworkNamespace();
  verdict.path_limit = sizeof(sockaddr_un::sun_path) - 1;
  if (verdict.abstract)
    JudgeAbstract(&verdict);
  else
    JudgeDirectory(&verdict);
  return verdict;
}

}  // namespace vmmipc::tool
