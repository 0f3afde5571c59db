// The importer's watch thread: poll the watch connections and a wake-up
// eventfd, read each event with its fd, let core follow it, ack.
//
// One thread serves every exporter, so nothing one exporter does may hold it:
// an ack is queued on its connection and sent without waiting (a message on
// a SOCK_SEQPACKET socket goes whole or not at all); what the socket does not
// take waits for POLLOUT on that connection alone. An exporter that leaves
// kMaxUnsentAcks of them unread loses its follow, with one warning, as one
// that breaks the protocol does: the other exporters' events never wait for
// it.
#include "transport/client/watch_client.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "common/fork_lock.h"
#include "common/log.h"
#include "common/parked.h"
#include "common/quiet_thread.h"
#include "common/syscall.h"
#include "transport/client/peer_fds.h"
#include "transport/reaper/fd_reaper.h"
#include "transport/socket_io.h"

namespace vmmipc::transport {

struct WatchClient::Impl {
  // Acks queued on one connection that its exporter has not taken (its
  // socket full). Each is a few dozen bytes; the socket itself holds
  // hundreds: an exporter this far behind has stopped reading.
  static constexpr size_t kMaxUnsentAcks = 256;

  EventHandler handler;
  EndedHandler ended = nullptr;
  int timeout_ms = 5000;
  // Guards connections and thread start; never held across I/O or the handler.
  // A fork lock (common/fork_lock.h): a forked child closes its copies of the
  // connections, whatever the parent's threads were doing.
  mutable ForkMutex mutex;
  std::map<uint64_t, WatchConnection> connections;  // by exporter tag
  ScopedFd wake_fd;                                 // eventfd: a connection was added, or stop
  std::atomic<bool> stopping{false};
  std::unique_ptr<std::thread> thread;
  // The acks each connection's exporter has not taken yet, by tag. The
  // thread's own: read and written by it alone, no lock.
  std::map<uint64_t, std::deque<std::vector<uint8_t>>> unsent;

  void Run() noexcept;
  // Reads and answers one event; false when the connection must go.
  bool Serve(uint64_t exporter, WatchConnection& connection) noexcept;
  // Sends the queued acks of `exporter` that its socket takes now, without
  // waiting; false when the connection must go (an error, or an exporter
  // that left kMaxUnsentAcks unread: its follow ends, said once).
  bool Flush(uint64_t exporter, WatchConnection& connection) noexcept;
  void Wake() noexcept {
    const uint64_t one = 1;
    (void)RetryOnEintr([&] { return ::write(wake_fd.get(), &one, sizeof(one)); });
  }
};

bool WatchClient::Impl::Serve(uint64_t exporter, WatchConnection& c) noexcept {
  try {
    // Room for the longer layout (an announcement's), and one byte more
    // to see a longer message as truncated.
    std::vector<uint8_t> buffer(wire::kAnnounceEventSize + 1);
    ReceivedMessage message;
    // Verified at the fetch: this connection is the exporter's own, so its
    // fds (a resume's) are taken; a message that does not verify ends it.
    // poll() said readable: this does not wait (WaitFor first, so not AfterMs(0)).
    const IoResult io = ReceiveMessage(c.fd.get(), buffer, &message, Deadline::AfterMs(timeout_ms));
    if (io.status == IoStatus::kTimeout) return true;
    if (!io.ok()) return false;  // the exporter exited or closed it
    wire::Event event;
    const wire::WireError parsed =
        message.truncated
            ? wire::WireError::kBadLength
            : wire::ParseEvent({buffer.data(), message.length}, c.nonce, c.key, &event);
    const size_t expected_fds = event.kind == wire::EventKind::kResume ? 1 : 0;
    // A resume's fd is checked before anything touches it: a socket (whose
    // last close may wait) is no device memory.
    std::string not_memory;
    const bool memory = AllMemoryFdKinds(message.fds, &not_memory);
    if (parsed != wire::WireError::kOk || message.control_truncated ||
        message.fds.size() != expected_fds || !memory) {
      VMMIPC_LOG_WARN(
          "follow: exporter pid {} sent an event out of protocol ({}, {} fds{}); closing the "
          "watch connection: its pauses and resumes are no longer followed",
          static_cast<uint32_t>(exporter >> 32), wire::WireErrorName(parsed), message.fds.size(),
          memory ? "" : ": " + not_memory);
      HandToReaper(&message.fds);  // not closed on the follow thread
      // Not followed any more while it runs: what this process holds of it
      // would go stale. The handler drops it, loudly.
      wire::Event unfollowed;
      unfollowed.kind = wire::EventKind::kUnfollowed;
      (void)handler(exporter, unfollowed, ScopedFd());
      return false;
    }
    ScopedFd fd;
    if (expected_fds == 1) fd = std::move(message.fds[0]);
    wire::Ack ack;
    ack.sequence = event.sequence;
    ack.status = handler(exporter, event, std::move(fd));
    const auto bytes = wire::EncodeAck(ack, c.nonce, c.key);
    unsent[exporter].emplace_back(bytes.begin(), bytes.end());
    return Flush(exporter, c) && event.kind != wire::EventKind::kUnfollowed;  // the last event
  } catch (...) {
    return false;
  }
}

bool WatchClient::Impl::Flush(uint64_t exporter, WatchConnection& c) noexcept {
  try {
    auto it = unsent.find(exporter);
    if (it == unsent.end()) return true;
    std::deque<std::vector<uint8_t>>& queue = it->second;
    while (!queue.empty()) {
      // Deadline 0: one try, never a wait (the socket full is kTimeout).
      const IoResult io = SendMessage(c.fd.get(), queue.front(), {}, Deadline::AfterMs(0));
      if (io.status == IoStatus::kTimeout) break;
      if (!io.ok()) return false;  // the exporter exited or closed it
      queue.pop_front();
    }
    if (queue.size() < kMaxUnsentAcks) {
      if (queue.empty()) unsent.erase(it);
      return true;
    }
    VMMIPC_LOG_WARN(
        "follow: exporter pid {} has not read this process's last {} acks; closing its watch "
        "connection, so that it delays no other exporter's events: its pauses and resumes are "
        "no longer followed here",
        static_cast<uint32_t>(exporter >> 32), queue.size());
    // Not followed any more while it runs: the handler drops what this
    // process holds of it, loudly, as for an exporter out of protocol.
    wire::Event unfollowed;
    unfollowed.kind = wire::EventKind::kUnfollowed;
    (void)handler(exporter, unfollowed, ScopedFd());
    return false;
  } catch (...) {
    return false;
  }
}

void WatchClient::Impl::Run() noexcept {
  std::vector<pollfd> pfds;
  std::vector<uint64_t> tags;
  while (!stopping.load(std::memory_order_acquire)) {
    pfds.clear();
    tags.clear();
    pfds.push_back({wake_fd.get(), POLLIN, 0});
    {
      std::lock_guard<ForkMutex> lock(mutex);
      for (const auto& [tag, connection] : connections) {
        // POLLOUT only while acks wait: an idle connection is always writable.
        const short wanted = unsent.count(tag) != 0 ? POLLIN | POLLOUT : POLLIN;
        pfds.push_back({connection.fd.get(), wanted, 0});
        tags.push_back(tag);
      }
    }
    // Nothing to time out here: the exporter's side bounds every exchange.
    const int n = ::poll(pfds.data(), pfds.size(), -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      VMMIPC_LOG_ERROR("follow: poll failed: {}; no longer following exporters", ErrnoText(errno));
      return;
    }
    if (pfds[0].revents != 0) {
      uint64_t count = 0;
      (void)!::read(wake_fd.get(), &count, sizeof(count));
    }
    for (size_t i = 0; i < tags.size(); ++i) {
      if (pfds[i + 1].revents == 0) continue;
      // Only this thread removes connections: the entry is still there.
      WatchConnection* connection = nullptr;
      {
        std::lock_guard<ForkMutex> lock(mutex);
        auto it = connections.find(tags[i]);
        if (it != connections.end()) connection = &it->second;
      }
      if (connection == nullptr) continue;
      const short revents = pfds[i + 1].revents;
      // Writable: the queued acks first. Then an event, if one came (a
      // hang-up or error reads as the connection's end there).
      bool keep = (revents & POLLOUT) == 0 || Flush(tags[i], *connection);
      if (keep && (revents & ~POLLOUT) != 0) keep = Serve(tags[i], *connection);
      if (keep) continue;
      unsent.erase(tags[i]);
      WatchConnection gone;
      {
        std::lock_guard<ForkMutex> lock(mutex);
        auto it = connections.find(tags[i]);
        gone = std::move(it->second);
        connections.erase(it);
      }
      VMMIPC_LOG_DEBUG("follow: watch connection to exporter pid {} closed",
                       static_cast<uint32_t>(tags[i] >> 32));
      CloseConnection(std::move(gone.fd));
      if (ended != nullptr) ended(tags[i]);
    }
  }
}

WatchClient::WatchClient(EventHandler handler, Timeout timeout, EndedHandler ended)
    : impl_(std::make_unique<Impl>()) {
  impl_->handler = std::move(handler);
  impl_->ended = ended;
  impl_->timeout_ms = timeout.ms();
}

WatchClient::~WatchClient() {
  if (!impl_) return;
  impl_->stopping.store(true, std::memory_order_release);
  if (impl_->thread) {
    impl_->Wake();
    if (impl_->thread->joinable()) impl_->thread->join();
  }
  for (auto& [tag, connection] : impl_->connections) CloseConnection(std::move(connection.fd));
}

bool WatchClient::Add(uint64_t exporter, WatchConnection connection, std::string* error) {
  std::unique_lock<ForkMutex> lock(impl_->mutex);
  if (!impl_->thread) {
    impl_->wake_fd.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!impl_->wake_fd) {
      *error = fmt::format("eventfd: {}", ErrnoText(errno));
      return false;
    }
    try {
      Impl* raw = impl_.get();
      impl_->thread = StartQuietThread("vmmipc-follow", [raw] { raw->Run(); });
    } catch (const std::exception& e) {
      *error = fmt::format("cannot start the follow thread: {}", e.what());
      impl_->wake_fd.Reset();
      return false;
    }
  }
  if (impl_->connections.count(exporter) != 0) {
    // After the lock, which a fork waits for: the close may go through the
    // reaper (its lock, perhaps its thread's start).
    lock.unlock();
    CloseConnection(std::move(connection.fd));  // one per exporter is enough
    return true;
  }
  impl_->connections.emplace(exporter, std::move(connection));
  impl_->Wake();
  return true;
}

bool WatchClient::Has(uint64_t exporter) const {
  std::lock_guard<ForkMutex> lock(impl_->mutex);
  return impl_->connections.count(exporter) != 0;
}

void WatchClient::PrepareFork() noexcept {
  if (impl_) impl_->mutex.PrepareFork();
}

void WatchClient::ParentAfterFork() noexcept {
  if (impl_) impl_->mutex.ParentAfterFork();
}

void WatchClient::AbandonAfterFork() noexcept {
  if (!impl_) return;
  Park(impl_->thread.release());  // it does not exist here; leaked on purpose
  // False only when the thread that forked held the lock itself: leave the copies open.
  if (impl_->mutex.ChildAfterFork()) {
    std::lock_guard<ForkMutex> lock(impl_->mutex);
    // A plain close: shutdown() would end the parent's connections too.
    for (auto& [tag, connection] : impl_->connections) ::close(connection.fd.Release());
    impl_->connections.clear();
  }
  Park(impl_.release());
}

}  // namespace vmmipc::transport
