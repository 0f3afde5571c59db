// OpenLogPath (log_file.h): the open, and the refusals worded for the line
// that says why a log file is not used.
#include "common/log_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <string_view>

namespace vmmipc::log {
namespace {

// "a FIFO", "a directory", ...: what a log file name turned out to be.
const char* KindName(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "a special file";
}

// Why the file `st` describes (found at `path`) must not take this process's
// lines; empty when it may. Only a regular file of our own euid, with one
// name, that neither group nor others can write: in a directory others can
// write, anything else may be theirs to read or to block on (a FIFO), or a
// way to append to a victim's file (a symbolic link, a hard link, a file of
// theirs we are allowed to write).
std::string Refusal(const struct stat& st, const std::string& path) {
  const unsigned mode = st.st_mode & 07777;
  if (S_ISLNK(st.st_mode)) {
    char target[PATH_MAX] = {};
    const ssize_t n = ::readlink(path.c_str(), target, sizeof(target) - 1);
    return fmt::format("it is a symbolic link{}, and symbolic links are not followed",
                       n > 0 ? fmt::format(" (to '{}')", std::string_view(target, n)) : "");
  }
  if (!S_ISREG(st.st_mode))
    return fmt::format("it is {} (uid {}, mode {:04o}), not a regular file", KindName(st.st_mode),
                       st.st_uid, mode);
  if (st.st_uid != geteuid())
    return fmt::format("it belongs to uid {}, not to this process's uid {} (mode {:04o})",
                       st.st_uid, geteuid(), mode);
  // A second name of some file: where fs.protected_hardlinks is 0 another
  // user can link any file they can see at the name, one of ours included
  // (a shell's profile), and our lines would be appended to it.
  if (st.st_nlink > 1)
    return fmt::format(
        "it has {} links (a hard link: another name of a file that may be any of ours), and hard "
        "links are not written (mode {:04o})",
        st.st_nlink, mode);
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
    return fmt::format("it is writable by {} (mode {:04o})",
                       (st.st_mode & S_IWGRP) == 0   ? "others"
                       : (st.st_mode & S_IWOTH) == 0 ? "its group"
                                                     : "its group and others",
                       mode);
  return {};
}

}  // namespace

int OpenLogPath(const std::string& path, const std::string& shown, bool create, std::string* why) {
  // 0600: the lines describe this user's processes (pids, addresses, peers,
  // failures), and vmmipc shares memory with the same user only; others have
  // no need to read them. The umask can only take bits away.
  const int flags =
      O_WRONLY | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | (create ? O_CREAT : 0);
  int fd;
  do {
    fd = ::open(path.c_str(), flags, 0600);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int error = errno;
    if (!create && error == ENOENT) return -1;
    // Say what is there when that is why (ELOOP: a symbolic link; ENXIO: a
    // FIFO nobody reads; EISDIR: a directory), else the error. lstat only
    // words the line: nothing is opened after it.
    struct stat st = {};
    std::string refusal;
    if (::lstat(path.c_str(), &st) == 0) refusal = Refusal(st, path);
    if (refusal.empty())
      *why = fmt::format("cannot open VMMIPC_LOG_FILE {}: {}; logging to stderr", shown,
                         std::strerror(error));
    else
      *why = fmt::format("cannot use VMMIPC_LOG_FILE {}: {} (open: {}); logging to stderr", shown,
                         refusal, std::strerror(error));
    errno = error;
    return -1;
  }
  struct stat st = {};
  std::string refusal = ::fstat(fd, &st) == 0
                            ? Refusal(st, path)
                            : fmt::format("fstat failed: {}", std::strerror(errno));
  if (refusal.empty()) {
    // Blocking writes from here on, as without O_NONBLOCK: Linux ignores the
    // flag for regular files today, but it belongs to the open file, which a
    // forked child shares, and a write must never return EAGAIN half done.
    const int flags_now = ::fcntl(fd, F_GETFL);
    if (flags_now < 0 || ::fcntl(fd, F_SETFL, flags_now & ~O_NONBLOCK) != 0)
      refusal = fmt::format("fcntl failed: {}", std::strerror(errno));
  }
  if (!refusal.empty()) {
    ::close(fd);
    *why = fmt::format("cannot use VMMIPC_LOG_FILE {}: {}; logging to stderr", shown, refusal);
    return -1;
  }
  return fd;
}

}  // namespace vmmipc::log
