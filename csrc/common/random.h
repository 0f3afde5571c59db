// Randomness from the kernel: for this process's handle secret, which must be
// unguessable (FillRandom), and for what must only never repeat, the public
// instance id and a request's nonce (FillUnique).
#pragma once

#include <cstddef>

namespace vmmipc {

// What each source answered when FillRandom failed: an errno each (EIO for a
// /dev/urandom that ended early), 0 for a source not asked or that worked.
struct RandomFailure {
  int getrandom_error = 0;
  int urandom_error = 0;
};

// Fills `size` bytes at `out` from the kernel's random generator: getrandom
// with GRND_NONBLOCK (no fd, works in a chroot and when the process is out of
// fds; never waits for the pool at early boot), else /dev/urandom (O_CLOEXEC;
// short reads continued, EINTR retried), for a seccomp policy that refuses
// getrandom, a kernel without it, or a pool not seeded yet. False when
// neither gave every byte: `*failure` (if given) then says why. getrandom's
// answer is in `*failure` even when /dev/urandom then served.
bool FillRandom(void* out, size_t size, RandomFailure* failure = nullptr) noexcept;

// Fills `size` bytes that differ from process to process and from call to
// call: FillRandom's when it works, else the clocks, the pid, the thread id, a
// stack address and a counter of this process mixed (SplitMix64), which can
// be guessed but never repeat. Never fails.
void FillUnique(void* out, size_t size) noexcept;

}  // namespace vmmipc
