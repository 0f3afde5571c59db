// Watcher (watcher.h): one event sent, the acks read, a missed notice folded.
#include "transport/serve/watch/watcher.h"

#include <poll.h>

#include "common/log.h"
#include "transport/reaper/fd_reaper.h"

namespace vmmipc::transport {
namespace {

// What a watch connection whose importer hung up (or that is in error)
// reports. Not "hung up and nothing to read": a Unix socket whose peer
// closed polls readable too (its EOF), so that test never held for an
// importer that exited.
constexpr short kHangUp = POLLHUP | POLLERR | POLLRDHUP | POLLNVAL;

}  // namespace

Watcher::~Watcher() { CloseConnection(std::move(fd)); }

bool Watcher::HungUp() const {
  pollfd p{fd.get(), POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & kHangUp) != 0;
}

bool Watcher::Send(const wire::Event& event, int event_fd, int notice, const Deadline& deadline,
                   int stop_fd, bool* would_block) {
  wire::Event numbered = event;
  numbered.sequence = sequence + 1;
  const int fds[1] = {event_fd};
  auto send = [&](std::span<const uint8_t> record) {
    return SendMessage(fd.get(), record, std::span<const int>(fds, event_fd >= 0 ? 1 : 0), deadline,
                       stop_fd);
  };
  // An announcement has its own, longer layout (the handle rides along).
  const IoResult io = event.kind == wire::EventKind::kAnnounce
                          ? send(wire::EncodeAnnounce(numbered, nonce, key))
                          : send(wire::EncodeEvent(numbered, nonce, key));
  *would_block = io.status == IoStatus::kTimeout || io.status == IoStatus::kStopped;
  if (io.ok()) {
    sequence = numbered.sequence;
    outstanding.emplace_back(numbered.sequence, notice);
    return true;
  }
  if (*would_block) return true;
  if (io.status != IoStatus::kPeerClosed)
    VMMIPC_LOG_WARN(
        "follow: sending an event to importer {} failed: {}; dropping its watch connection",
        PeerPidText(pid), IoStatusName(io.status));
  return false;
}

bool Watcher::ReadAcks(std::vector<std::vector<uint32_t>>* done, size_t max_acks,
                       const Deadline* deadline) {
  std::vector<uint8_t> buffer(wire::kAckSize + 1);
  // Bounded by the count and by the caller's deadline, whatever the peer
  // keeps queueing (docs/security.md, "Reading from a peer"): a follower
  // that floods acks cannot keep its reader here.
  for (size_t taken = 0; taken < max_acks; ++taken) {
    if (taken > 0 && deadline != nullptr && deadline->Expired()) return true;
    // Looked at before it is taken: a watcher has no business sending fds,
    // and one that does is closed through the reaper with them queued.
    PeekedMessage peeked;
    const IoResult io = PeekMessage(fd.get(), buffer, &peeked, Deadline::AfterMs(0));
    if (io.status == IoStatus::kTimeout) return true;
    wire::Ack ack;
    const bool valid =
        io.ok() && !peeked.carries_fds && !peeked.truncated &&
        wire::ParseAck({buffer.data(), peeked.length}, nonce, key, &ack) == wire::WireError::kOk;
    if (!valid) {
      if (io.status != IoStatus::kPeerClosed)
        VMMIPC_LOG_WARN(
            "follow: importer {} answered out of protocol; dropping its watch connection",
            PeerPidText(pid));
      return false;
    }
    DiscardPeekedMessage(fd.get());
    // Acks come in the order of the events: one for a later event means the
    // ones before it were skipped (never, from a well-behaved importer).
    while (!outstanding.empty() &&
           static_cast<int32_t>(ack.sequence - outstanding.front().first) > 0)
      outstanding.pop_front();
    if (outstanding.empty() || outstanding.front().first != ack.sequence) {
      // An ack of nothing outstanding: an old, already-acked or skipped
      // event's, or one never sent. It counts against the follower.
      if (++stray_acks > kMaxStrayAcks) {
        VMMIPC_LOG_WARN(
            "follow: importer {} sent more than {} acks of events it was not waiting to ack "
            "(a flood); dropping its watch connection: it is not waited for again, nor told "
            "of pauses",
            PeerPidText(pid), kMaxStrayAcks);
        return false;
      }
      continue;
    }
    const int notice = outstanding.front().second;
    outstanding.pop_front();
    if (notice >= 0 && ack.status == wire::AckStatus::kDone && done != nullptr)
      (*done)[static_cast<size_t>(notice)].push_back(follower);
  }
  return true;  // the rest stays queued for the next pass
}

bool Watcher::Answered() const {
  return outstanding.empty() || static_cast<int32_t>(outstanding.front().first - lag_sequence) > 0;
}

void Watcher::Fold(bool resume, uint64_t base, uint64_t size, uint32_t generation) {
  auto it = backlog.find(base);
  if (it == backlog.end()) {
    Missed missed;
    // Before this notice the follower held what it says changed: a pause
    // takes a mapped chunk away, a resume maps a paused one.
    missed.held_mapped = !resume;
    missed.held_generation = generation;
    missed.held_size = size;
    it = backlog.emplace(base, missed).first;
  }
  it->second.stale = false;
  it->second.now_mapped = resume;
  it->second.now_generation = generation;
  it->second.now_size = size;
}

}  // namespace vmmipc::transport
