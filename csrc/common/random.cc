// getrandom, else /dev/urandom; and the mix of clocks and ids that is unique
// without them.
#include "common/random.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <ctime>

#include "common/scoped_fd.h"
#include "common/syscall.h"

namespace vmmipc {
namespace {

// 0 when all `size` bytes came, else the errno.
int FromGetrandom(uint8_t* out, size_t size) {
  for (size_t done = 0; done < size;) {
    const ssize_t n = ::getrandom(out + done, size - done, GRND_NONBLOCK);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno != 0 ? errno : EIO;
    }
    done += static_cast<size_t>(n);
  }
  return 0;
}

int FromUrandom(uint8_t* out, size_t size) {
  const int fd = RetryOnEintr([] { return ::open("/dev/urandom", O_RDONLY | O_CLOEXEC); });
  if (fd < 0) return errno != 0 ? errno : EIO;
  ScopedFd file(fd);
  for (size_t done = 0; done < size;) {
    const ssize_t n = RetryOnEintr([&] { return ::read(file.get(), out + done, size - done); });
    if (n < 0) return errno != 0 ? errno : EIO;
    if (n == 0) return EIO;  // a /dev/urandom that ends is not one
    done += static_cast<size_t>(n);
  }
  return 0;
}

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t Nanoseconds(clockid_t clock) {
  timespec t{};
  ::clock_gettime(clock, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000ull + static_cast<uint64_t>(t.tv_nsec);
}

}  // namespace

bool FillRandom(void* out, size_t size, RandomFailure* failure) noexcept {
  RandomFailure local;
  RandomFailure& why = failure != nullptr ? *failure : local;
  why = RandomFailure{};
  uint8_t* bytes = static_cast<uint8_t*>(out);
  why.getrandom_error = FromGetrandom(bytes, size);
  if (why.getrandom_error == 0) return true;
  why.urandom_error = FromUrandom(bytes, size);
  return why.urandom_error == 0;
}

void FillUnique(void* out, size_t size) noexcept {
  if (FillRandom(out, size)) return;
  static std::atomic<uint64_t> calls{0};
  // Each input in its own round: a clock that does not move (a coarse one, a
  // frozen one in a sandbox) still leaves the pid, the thread and the count.
  uint64_t state = Nanoseconds(CLOCK_REALTIME);
  const uint64_t inputs[] = {Nanoseconds(CLOCK_MONOTONIC), static_cast<uint64_t>(::getpid()),
                             static_cast<uint64_t>(::syscall(SYS_gettid)),
                             reinterpret_cast<uintptr_t>(&state), calls.fetch_add(1) + 1};
  for (uint64_t input : inputs) state = SplitMix64(&state) ^ input;
  uint8_t* bytes = static_cast<uint8_t*>(out);
  for (size_t done = 0; done < size; done += sizeof(uint64_t)) {
    const uint64_t word = SplitMix64(&state);
    std::memcpy(bytes + done, &word, std::min(sizeof(word), size - done));
  }
}

}  // namespace vmmipc
