// Helpers for system calls, shared by every layer and free of CUDA (the
// transport includes this, never driver/status.h): retry on EINTR, and errno as text
// for the one log line where a failure starts.
#pragma once

#include <errno.h>

#include <cstring>

namespace vmmipc {

// Runs a syscall-like callable until it stops failing with EINTR.
template <typename Call>
auto RetryOnEintr(Call call) -> decltype(call()) {
  decltype(call()) result;
  do {
    result = call();
  } while (result == -1 && errno == EINTR);
  return result;
}

inline const char* ErrnoText(int error) {
  return strerrordesc_np(error) ? strerrordesc_np(error) : "unknown error";
}

}  // namespace vmmipc
