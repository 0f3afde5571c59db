// The listener's admission (admission.h): which accepted connections may
// wait for their request, by class, and which replies may wait for a worker,
// within caps the host's free fds set (fd_budget.h), measured again when a
// class is full; the newest connection past a cap is closed at once, a reply
// past the queue's cap refused.
#include "transport/serve/listener/admission.h"

#include <algorithm>

#include "common/log.h"
#include "transport/reaper/fd_reaper.h"

namespace vmmipc::transport {

// A connection that must wait for its request, if its class has room; the
// newest of a full class is closed at once. Our uid's and other uids' are
// counted apart, so that another user never takes our importers' room.
void Admission::Admit(Connection connection) noexcept {
  try {
    std::string why = OverCap(connection.peer.uid);
    // Full: perhaps the host has closed fds since the caps were set.
    if (!why.empty() && RefreshBudget()) why = OverCap(connection.peer.uid);
    if (!why.empty()) {
      DropOverCap(std::move(connection), *context_, why);
      return;
    }
    // Never grows past the capacity reserved at Start: the caps are below it.
    ++(connection.peer.uid == context_->uid ? own_waiting : others_waiting);
    waiting.push_back(std::move(connection));
  } catch (...) {
    CloseConnection(std::move(connection.fd));
  }
}

// Empty when a connection of `uid` may wait; else why not, for the log line.
std::string Admission::OverCap(uint32_t uid) const {
  const ConnectionCaps& caps = budget.caps();
  if (uid == context_->uid) {
    if (own_waiting < caps.own_waiting) return {};
    return fmt::format(
        "{} connections of this uid wait for their request already, the most while {} of "
        "this process's {} fds are free",
        own_waiting, budget.free_fds(), budget.limit());
  }
  if (others_waiting >= caps.others_waiting)
    return fmt::format("{} connections of other users wait already (at most {} together)",
                       others_waiting, caps.others_waiting);
  const size_t of_uid = static_cast<size_t>(std::count_if(
      waiting.begin(), waiting.end(), [uid](const Connection& c) { return c.peer.uid == uid; }));
  if (of_uid >= caps.per_other_uid)
    return fmt::format("{} connections of uid {} wait already (at most {} per other user)", of_uid,
                       uid, caps.per_other_uid);
  return {};
}

void Admission::Keep(ScopedFd fd, const PeerCredentials& peer) noexcept {
  if (!fd.valid()) return;
  const size_t of_peer = static_cast<size_t>(std::count_if(
      kept.begin(), kept.end(), [&](const Connection& c) { return c.peer.pid == peer.pid; }));
  // Never grows past the capacity reserved at Start: the cap is below it.
  if (kept.size() >= budget.caps().kept || of_peer >= kMaxKeptPerPeer ||
      kept.size() == kept.capacity()) {
    CloseConnection(std::move(fd));
    return;
  }
  kept.push_back(Connection{std::move(fd), peer, Deadline::AfterMs(kKeptIdleMs), true});
}

// Only the poll thread queues replies (the workers take them off, posted
// tasks hold no fds): what it reads here is the most the queue holds until
// its Dispatch.
bool Admission::MayQueue(size_t fds, std::string* why) noexcept {
  const size_t queued = workers_->queued_fds();
  auto fits = [&] { return queued == 0 || queued + fds <= budget.caps().queued_reply_fds; };
  // Full: perhaps the host has closed fds since the cap was set.
  if (fits() || (RefreshBudget() && fits())) return true;
  try {
    *why = fmt::format(
        "busy: replies holding {} fds wait for a worker already, and this one holds {} (at most "
        "{} while {} of this process's {} fds are free)",
        queued, fds, budget.caps().queued_reply_fds, budget.free_fds(), budget.limit());
  } catch (...) {
    // Refused all the same, without the reason.
  }
  return false;
}

// The fds the listener holds: waiting, kept and watch connections, and the
// replies queued for a worker.
size_t Admission::Held() const noexcept {
  return waiting.size() + kept.size() +
         (context_->watchers != nullptr ? context_->watchers->count() : 0) + workers_->queued_fds();
}

void Admission::MeasureBudget(bool out_of_fds) noexcept {
  budget.Measure(Held(), out_of_fds);
  watchers_->SetMaxWatchers(budget.caps().watchers);
}

bool Admission::RefreshBudget() noexcept {
  if (!budget.Refresh(Held())) return false;
  watchers_->SetMaxWatchers(budget.caps().watchers);
  return true;
}

}  // namespace vmmipc::transport
