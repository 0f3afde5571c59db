// The exit table of socket files: slots claimed and released by atomic
// compare-exchange, so that a listener's stop and the exit handler (on
// whichever thread calls exit) never both remove a file, and a stop never
// removes a file whose slot was taken again by another listener meanwhile
// (every claim has a sequence number of its own).
#include "transport/serve/listener/socket_file.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace vmmipc::transport {
namespace {

// One listener per process is the rule (tests start more); past this many
// filesystem listeners at once, a file is removed at its stop only.
constexpr int kSlots = 16;

// A slot's state: its phase in the low bits, the sequence number of the
// claim above them.
enum Phase : uint64_t { kFree = 0, kClaimed = 1, kArmed = 2, kRemoving = 3 };
constexpr uint64_t kPhaseMask = 3;
constexpr uint64_t State(uint64_t sequence, Phase phase) { return sequence << 2 | phase; }

struct Slot {
  std::atomic<uint64_t> state{0};
  // Written while claimed, read once armed (the state's release/acquire);
  // the pid is also read to tell a parent's slot in a forked child.
  std::atomic<pid_t> pid{0};
  dev_t dev = 0;
  ino_t ino = 0;
  char path[sizeof(sockaddr_un::sun_path)] = {};
};

constinit Slot g_slots[kSlots];
constinit std::atomic<uint64_t> g_sequence{0};
constinit std::atomic<bool> g_exit_handler{false};

// Unlinks `path` if it still names the inode (dev, ino). Between the lstat
// and the unlink only a process of our own uid could swap the file: the
// directory is the user's and no one else's (socket_address.h).
void UnlinkIfSame(const char* path, dev_t dev, ino_t ino) {
  struct stat st {};
  if (::lstat(path, &st) == 0 && st.st_dev == dev && st.st_ino == ino) ::unlink(path);
}

// The process exits: remove what is still armed and this process's (a forked
// child's table holds its parent's files too). On the exiting thread, while
// others may run: atomics and two syscalls per file, nothing else.
void RemoveAtExit() {
  const pid_t self = ::getpid();
  for (Slot& slot : g_slots) {
    uint64_t state = slot.state.load(std::memory_order_acquire);
    if ((state & kPhaseMask) != kArmed || slot.pid.load(std::memory_order_relaxed) != self)
      continue;
    const uint64_t sequence = state >> 2;
    if (!slot.state.compare_exchange_strong(state, State(sequence, kRemoving),
                                            std::memory_order_acquire))
      continue;  // its listener is removing it
    UnlinkIfSame(slot.path, slot.dev, slot.ino);
    slot.state.store(State(sequence, kFree), std::memory_order_release);
  }
}

// A slot for this process's file; -1 when every slot holds another live one.
int Claim(uint64_t* sequence) {
  const pid_t self = ::getpid();
  const uint64_t mine = g_sequence.fetch_add(1, std::memory_order_relaxed) + 1;
  for (int i = 0; i < kSlots; ++i) {
    Slot& slot = g_slots[i];
    uint64_t state = slot.state.load(std::memory_order_acquire);
    // Free, or armed by another process: our parent's, copied by the fork
    // (its listener is not ours to serve, and neither is its file).
    const Phase phase = static_cast<Phase>(state & kPhaseMask);
    if (phase != kFree && !(phase == kArmed && slot.pid.load(std::memory_order_relaxed) != self))
      continue;
    if (slot.state.compare_exchange_strong(state, State(mine, kClaimed),
                                           std::memory_order_acquire)) {
      *sequence = mine;
      return i;
    }
  }
  return -1;
}

}  // namespace

bool BoundSocketFile::Adopt(const std::string& path) noexcept {
  struct stat st {};
  // lstat: what bind() made must still be there, a socket, and not a symlink
  // someone swapped in after it.
  if (path.size() >= sizeof(sockaddr_un::sun_path) || ::lstat(path.c_str(), &st) != 0 ||
      !S_ISSOCK(st.st_mode))
    return false;
  try {
    path_ = path;
  } catch (...) {
    return false;
  }
  dev_ = st.st_dev;
  ino_ = st.st_ino;
  adopted_ = true;
  slot_ = Claim(&sequence_);
  if (slot_ < 0) return true;  // removed at its stop only
  Slot& slot = g_slots[slot_];
  slot.pid.store(::getpid(), std::memory_order_relaxed);
  slot.dev = dev_;
  slot.ino = ino_;
  std::memcpy(slot.path, path.c_str(), path.size() + 1);
  slot.state.store(State(sequence_, kArmed), std::memory_order_release);
  // Registered with the first file, not at load: nothing at load time may
  // fail. A failed registration leaves removal at stop only.
  if (!g_exit_handler.exchange(true) && std::atexit(RemoveAtExit) != 0) g_exit_handler = false;
  return true;
}

void BoundSocketFile::Remove() noexcept {
  if (!adopted_) return;
  adopted_ = false;
  if (slot_ < 0) {
    UnlinkIfSame(path_.c_str(), dev_, ino_);
    return;
  }
  Slot& slot = g_slots[slot_];
  slot_ = -1;
  uint64_t armed = State(sequence_, kArmed);
  // Lost: the exit handler is removing it (or has).
  if (!slot.state.compare_exchange_strong(armed, State(sequence_, kRemoving),
                                          std::memory_order_acquire))
    return;
  UnlinkIfSame(path_.c_str(), dev_, ino_);
  slot.state.store(State(sequence_, kFree), std::memory_order_release);
}

void BoundSocketFile::Forget() noexcept {
  // The slot stays armed with the parent's pid: this process's exit skips
  // it, and a listener of its own may claim it.
  adopted_ = false;
  slot_ = -1;
}

}  // namespace vmmipc::transport
