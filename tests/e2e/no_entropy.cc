// A test double of a sandbox without randomness, preloaded ahead of vmmipc
// (LD_PRELOAD=<this>:libvmmipc.so): getrandom is refused as a seccomp policy
// refuses it (EPERM), and /dev/urandom does not exist (ENOENT). Every other
// open goes to the kernel as it is. No libc state is used: raw syscalls only,
// and no dlsym (vmmipc's own would answer it).
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

namespace {

bool IsUrandom(const char* path) { return path != nullptr && strcmp(path, "/dev/urandom") == 0; }

int OpenAt(int directory, const char* path, int flags, mode_t mode) {
  if (IsUrandom(path)) {
    errno = ENOENT;
    return -1;
  }
  return static_cast<int>(syscall(SYS_openat, directory, path, flags, mode));
}

mode_t ModeOf(int flags, va_list args) {
  return (flags & (O_CREAT | O_TMPFILE)) != 0 ? static_cast<mode_t>(va_arg(args, int)) : 0;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) ssize_t getrandom(void*, size_t, unsigned int) {
  errno = EPERM;
  return -1;
}

__attribute__((visibility("default"))) int open(const char* path, int flags, ...) {
  va_list args;
  va_start(args, flags);
  const mode_t mode = ModeOf(flags, args);
  va_end(args);
  return OpenAt(AT_FDCWD, path, flags, mode);
}

__attribute__((visibility("default"))) int open64(const char* path, int flags, ...) {
  va_list args;
  va_start(args, flags);
  const mode_t mode = ModeOf(flags, args);
  va_end(args);
  return OpenAt(AT_FDCWD, path, flags, mode);
}

__attribute__((visibility("default"))) int openat(int directory, const char* path, int flags, ...) {
  va_list args;
  va_start(args, flags);
  const mode_t mode = ModeOf(flags, args);
  va_end(args);
  return OpenAt(directory, path, flags, mode);
}

__attribute__((visibility("default"))) int openat64(int directory, const char* path, int flags,
                                                    ...) {
  va_list args;
  va_start(args, flags);
  const mode_t mode = ModeOf(flags, args);
  va_end(args);
  return OpenAt(directory, path, flags, mode);
}

}  // extern "C"
