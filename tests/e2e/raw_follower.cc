// vmmipc_peer's raw follower (raw_follower.h).
#include "raw_follower.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/scoped_fd.h"
#include "ledger/handle_codec.h"
#include "transport/client/fetch_client.h"
#include "transport/socket_io.h"
#include "transport/wire.h"

namespace vmmipc::testing {
namespace {

namespace wire = transport::wire;

std::string Hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

const char* KindName(wire::EventKind kind) {
  switch (kind) {
    case wire::EventKind::kPause:
      return "pause";
    case wire::EventKind::kResume:
      return "resume";
    case wire::EventKind::kUnfollowed:
      return "unfollowed";
    case wire::EventKind::kAnnounce:  // never asked for here
      return "announce";
  }
  return "unknown";
}

int TimeoutMs() {
  const char* value = std::getenv("VMMIPC_TIMEOUT_MS");
  return value != nullptr ? std::atoi(value) : 5000;
}

class RawFollower {
 public:
  ~RawFollower() {
    if (!reader_.joinable()) return;
    const uint64_t one = 1;
    (void)!write(stop_.get(), &one, sizeof(one));
    reader_.join();
  }

  enum class Mode { kAck, kSilent, kHeld };

  std::string Watch(const std::string& hex, uint32_t follower, Mode mode) {
    if (watch_.fd.valid()) return "err already watching";
    transport::FetchRequest request;
    if (!Request(hex, &request)) return "err not a VMM2 handle";
    transport::FetchResult fetched = Fetch(request, follower);
    if (fetched.status != transport::FetchStatus::kOk)
      return std::string("err ") + transport::FetchStatusName(fetched.status) + ": " +
             fetched.detail;
    if (!fetched.watch.fd.valid()) return "err granted without a watch connection";
    std::string answer = "ok " + std::to_string(fetched.chunks.size());
    for (transport::ChunkGrant& chunk : fetched.chunks) {
      answer += " " + Hex(chunk.address) + "+" + Hex(chunk.size);
      granted_.push_back(std::move(chunk.fd));  // held, as an importer's mapping holds its memory
    }
    watch_ = std::move(fetched.watch);
    mode_ = mode;
    if (mode == Mode::kSilent) return answer;  // nothing read, nothing acked
    stop_.Reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!stop_.valid()) return "err eventfd";
    reader_ = std::thread([this] { Read(); });
    return answer;
  }

  // A fetch without the watch flag under `follower`: the follower holds the
  // chunks too (its watch connection, if any, hears of them).
  std::string FetchHeld(const std::string& hex, uint32_t follower) {
    transport::FetchRequest request;
    if (!Request(hex, &request)) return "err not a VMM2 handle";
    transport::FetchResult fetched = Fetch(request, follower, /*watch=*/false);
    if (fetched.status != transport::FetchStatus::kOk)
      return std::string("err ") + transport::FetchStatusName(fetched.status);
    for (transport::ChunkGrant& chunk : fetched.chunks) granted_.push_back(std::move(chunk.fd));
    return "ok " + std::to_string(fetched.chunks.size());
  }

  // `count` watch fetches of one handle under followers first, first + 1, ...
  std::string WatchMany(const std::string& hex, uint32_t first, int count) {
    transport::FetchRequest request;
    if (!Request(hex, &request)) return "err not a VMM2 handle";
    int granted = 0;
    for (int i = 0; i < count; ++i) {
      transport::FetchResult fetched = Fetch(request, first + static_cast<uint32_t>(i));
      if (fetched.status != transport::FetchStatus::kOk) continue;
      ++granted;
      // Kept whether or not the exporter keeps its end (it closes one it
      // does not keep after the reply): the test counts the exporter's.
      if (fetched.watch.fd.valid()) many_.push_back(std::move(fetched.watch));
    }
    return "ok " + std::to_string(granted);
  }

  // Acks "done" every event logged and not acked yet (mode held).
  std::string Ack() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!watch_.fd.valid()) return "err not watching";
    if (!closed_ && !Drain()) closed_ = true;
    size_t acked = 0;
    for (uint32_t sequence : unacked_) {
      if (!SendAck(sequence)) return "err ack not sent";
      ++acked;
    }
    unacked_.clear();
    return "ok " + std::to_string(acked);
  }

  // Every event so far, oldest first: "kind:base:generation:fds", and
  // "closed" once the exporter ended the connection.
  std::string Events() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!watch_.fd.valid() && log_.empty()) return "err not watching";
    if (!closed_ && !Drain()) closed_ = true;
    std::string answer = "ok";
    for (const std::string& event : log_) answer += " " + event;
    return closed_ ? answer + " closed" : answer;
  }

 private:
  static bool Request(const std::string& hex, transport::FetchRequest* request) {
    unsigned char raw[ledger::kHandleSize];
    if (hex.size() != 2 * ledger::kHandleSize) return false;
    for (size_t i = 0; i < ledger::kHandleSize; ++i)
      raw[i] = static_cast<unsigned char>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
    ledger::Vmm2Handle h;
    if (ledger::DecodeHandle(raw, &h) != ledger::DecodeStatus::kOk) return false;
    *request = {
        {h.pid, h.generation, h.rank_slot, h.address, h.chunk_base, h.chunk_size, h.region_base},
        h.capability,
        h.version >= 3 ? h.instance : 0};
    return true;
  }

  static transport::FetchResult Fetch(const transport::FetchRequest& request, uint32_t follower,
                                      bool watch = true) {
    const char* dir = std::getenv("VMMIPC_SOCKET_DIR");
    const transport::ClientOptions options{dir != nullptr ? dir : "", Timeout::Ms(TimeoutMs()),
                                           watch, follower};
    return transport::FetchChunks(request, options);
  }

  bool SendAck(uint32_t sequence) {
    wire::Ack ack;
    ack.sequence = sequence;
    ack.status = wire::AckStatus::kDone;
    const auto bytes = wire::EncodeAck(ack, watch_.nonce, watch_.key);
    return transport::SendMessage(watch_.fd.get(), bytes, {},
                                  transport::Deadline::AfterMs(TimeoutMs()))
        .ok();
  }

  void Read() {
    for (;;) {
      pollfd p[2] = {{watch_.fd.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
      if (poll(p, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (p[1].revents != 0) return;
      std::lock_guard<std::mutex> lock(mutex_);
      if (closed_) return;
      if (!Drain()) {
        closed_ = true;
        return;
      }
    }
  }

  // Takes every event queued now, logs it and acks it "done" (or, held,
  // keeps its sequence for raw_ack), under mutex_; false once the
  // connection is over. Silent: takes nothing.
  bool Drain() {
    if (mode_ == Mode::kSilent) return true;
    for (;;) {
      std::vector<uint8_t> buffer(wire::kEventSize + 1);
      transport::ReceivedMessage message;
      const transport::IoResult io = transport::ReceiveMessage(watch_.fd.get(), buffer, &message,
                                                               transport::Deadline::AfterMs(0));
      if (io.status == transport::IoStatus::kTimeout) return true;  // nothing queued
      if (!io.ok()) return false;
      wire::Event event;
      const wire::WireError parsed =
          message.truncated
              ? wire::WireError::kBadLength
              : wire::ParseEvent({buffer.data(), message.length}, watch_.nonce, watch_.key, &event);
      if (parsed != wire::WireError::kOk) {
        log_.push_back(std::string("invalid:") + wire::WireErrorName(parsed));
        return false;
      }
      log_.push_back(std::string(KindName(event.kind)) + ":" + Hex(event.base) + ":" +
                     std::to_string(event.generation) + ":" + std::to_string(message.fds.size()));
      if (mode_ == Mode::kHeld) {
        unacked_.push_back(event.sequence);
      } else if (!SendAck(event.sequence)) {
        return false;
      }
    }
  }

  transport::WatchConnection watch_;
  Mode mode_ = Mode::kAck;
  std::vector<transport::WatchConnection> many_;  // raw_watches'
  std::vector<ScopedFd> granted_;
  ScopedFd stop_;
  std::mutex mutex_;
  std::vector<std::string> log_;   // under mutex_
  std::vector<uint32_t> unacked_;  // under mutex_: held, not acked yet
  bool closed_ = false;            // under mutex_
  std::thread reader_;
};

RawFollower& Follower() {
  static RawFollower follower;
  return follower;
}

}  // namespace

bool RawFollowerCommand(const std::vector<std::string>& a, std::string* reply) {
  if (a[0] == "raw_watch") {  // hex follower [ack|silent|held]
    const std::string mode = a.size() > 3 ? a[3] : "ack";
    *reply = Follower().Watch(a.at(1), static_cast<uint32_t>(std::stoul(a.at(2), nullptr, 0)),
                              mode == "silent" ? RawFollower::Mode::kSilent
                              : mode == "held" ? RawFollower::Mode::kHeld
                                               : RawFollower::Mode::kAck);
  } else if (a[0] == "raw_watches") {  // hex first count
    *reply = Follower().WatchMany(a.at(1), static_cast<uint32_t>(std::stoul(a.at(2), nullptr, 0)),
                                  std::stoi(a.at(3)));
  } else if (a[0] == "raw_fetch") {  // hex follower
    *reply = Follower().FetchHeld(a.at(1), static_cast<uint32_t>(std::stoul(a.at(2), nullptr, 0)));
  } else if (a[0] == "raw_ack") {
    *reply = Follower().Ack();
  } else if (a[0] == "raw_events") {
    *reply = Follower().Events();
  } else {
    return false;
  }
  return true;
}

}  // namespace vmmipc::testing
