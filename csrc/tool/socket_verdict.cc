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
#include "transport/socket_uid.h"

namespace vmmipc::tool {
namespace {

std::string NetworkNamespace() {
  char link[64] = {};
  const ssize_t got = readlink("/proc/self/ns/net", link, sizeof(link) - 1);
  return got > 0 ? std::string(link, static_cast<size_t>(got)) : "unknown";
}

// The display of an address with its instance written as "<instance>".
std::string Pattern(const std::string& display, uint32_t instance) {
  std::string pattern = display;
  const std::string digits = fmt::format(".i{:08x}", instance);
  const size_t at = pattern.rfind(digits);
  if (at != std::string::npos) pattern.replace(at, digits.size(), ".i<instance>");
  return pattern;
}

// Every exporter's name has the same length (8 hex digits of its instance),
// so one name stands for all of them; its own pid's bits make it one no
// exporter is likely to hold while this tool binds it.
uint32_t SampleInstance() { return 0x80000000u | static_cast<uint32_t>(getpid()); }

// CheckSocketDir's error without its "socket directory '<dir>' " lead.
std::string Reason(const std::string& error, const std::string& dir) {
  const std::string lead = fmt::format("socket directory '{}' ", dir);
  return error.rfind(lead, 0) == 0 ? error.substr(lead.size()) : error;
}

void JudgeAbstract(SocketVerdict* verdict) {
  transport::SocketAddress address;
  std::string error;
  const uint32_t instance = SampleInstance();
  if (!transport::NameSocketAddress(verdict->name_uid, transport::SocketOwner::Instance(instance),
                                    "", &address, &error)) {
    verdict->problem = "bind_failed";
    verdict->why = error;
    return;
  }
  verdict->pattern = Pattern(address.display, instance);
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
  // Every exporter's path has the same length: when one fits, all do.
  const uint32_t instance = SampleInstance();
  transport::SocketAddress address;
  if (!transport::NameSocketAddress(verdict->name_uid, transport::SocketOwner::Instance(instance),
                                    dir, &address, &error)) {
    verdict->problem = "too_long";
    verdict->why = error;
    verdict->pattern =
        Pattern(dir + "/" +
                    transport::SocketBaseName(verdict->name_uid,
                                              transport::SocketOwner::Instance(instance)) +
                    ".sock",
                instance);
    return;
  }
  verdict->longest_path = address.path.size();
  verdict->pattern = Pattern(address.path, instance);
  verdict->usable = true;
}

}  // namespace

SocketVerdict JudgeSockets(const std::string& socket_dir, uint32_t uid) {
  SocketVerdict verdict;
  verdict.abstract = socket_dir.empty();
  verdict.dir = socket_dir;
  verdict.uid = uid;
  verdict.name_uid = transport::SocketNameUid(uid);
  verdict.network_namespace = NetworkNamespace();
  verdict.path_limit = sizeof(sockaddr_un::sun_path) - 1;
  // The library's own rule (transport/socket_uid.h): a process of the
  // overflow uid neither serves nor takes any listener for its own.
  if (transport::IsOverflowUid(uid)) {
    verdict.problem = "overflow_uid";
    verdict.why = fmt::format(
        "this process runs as the overflow uid {}: a user namespace without a uid mapping "
        "(such as `unshare --user`), where every other user's process reads as this uid too; "
        "vmmipc does not export from it (cuIpcGetMemHandle fails) and refuses every exporter "
        "as not its own; map the namespace's uid (--map-root-user, or the container "
        "runtime's user mapping)",
        uid);
    return verdict;
  }
  if (verdict.abstract)
    JudgeAbstract(&verdict);
  else
    JudgeDirectory(&verdict);
  return verdict;
}

}  // namespace vmmipc::tool
