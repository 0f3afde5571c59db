// transport/watch_client: the importer's follow thread hands every event to
// core and acks it; an exporter that stops following it (kUnfollowed), or
// that sends anything out of protocol, makes core drop what it holds of that
// exporter (a kUnfollowed to the handler) and the connection closes.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "lingering_socket.h"
#include "test_process.h"
#include "transport/client/watch_client.h"
#include "transport/socket_io.h"

namespace vmmipc::transport {
namespace {

using testing::SeqpacketPair;
using wire::EventKind;

const SipKey kKey{0x1111, 0x2222};
constexpr wire::Nonce kNonce = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 1, 2, 3, 4, 5, 6};
constexpr uint64_t kTag = (uint64_t{42} << 32) | 7;

struct Seen {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<EventKind> kinds;
  std::vector<wire::Event> events;
  bool WaitFor(size_t count) {
    std::unique_lock<std::mutex> lock(mutex);
    return changed.wait_for(lock, std::chrono::seconds(5), [&] { return kinds.size() >= count; });
  }
};

// The ended handler's (a plain function pointer): the tags it was told of.
struct Ended {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<uint64_t> tags;
};
Ended g_ended;
void OnEnded(uint64_t tag) {
  std::lock_guard<std::mutex> lock(g_ended.mutex);
  g_ended.tags.push_back(tag);
  g_ended.changed.notify_all();
}

class WatchClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto [client_end, exporter_end] = SeqpacketPair();
    exporter_ = std::move(exporter_end);
    client_ = std::make_unique<WatchClient>(
        [this](uint64_t tag, const wire::Event& event, ScopedFd) {
          EXPECT_EQ(tag, kTag);
          std::lock_guard<std::mutex> lock(seen_.mutex);
          seen_.kinds.push_back(event.kind);
          seen_.events.push_back(event);
          seen_.changed.notify_all();
          // Core ignores an announcement it has no use for: kNotHeld.
          return event.kind == EventKind::kAnnounce ? wire::AckStatus::kNotHeld
                                                    : wire::AckStatus::kDone;
        },
        Timeout::Ms(1000), OnEnded);
    std::lock_guard<std::mutex> lock(g_ended.mutex);
    g_ended.tags.clear();
    WatchConnection connection;
    connection.fd = std::move(client_end);
    connection.key = kKey;
    connection.nonce = kNonce;
    std::string error;
    ASSERT_TRUE(client_->Add(kTag, std::move(connection), &error)) << error;
  }

  // True once the client closed its end (the exporter's end reads EOF).
  bool ClosedByClient() {
    std::vector<uint8_t> buffer(64);
    for (;;) {
      ReceivedMessage message;
      const IoResult io =
          ReceiveMessage(exporter_.get(), buffer, &message, Deadline::AfterMs(5000));
      if (io.status == IoStatus::kPeerClosed) return true;
      if (!io.ok()) return false;  // an ack: read on
    }
  }

  // The ack of the next message the client sent (waits at most a second).
  bool ReadAck(wire::Ack* ack) {
    std::vector<uint8_t> buffer(wire::kAckSize + 1);
    ReceivedMessage message;
    return ReceiveMessage(exporter_.get(), buffer, &message, Deadline::AfterMs(1000)).ok() &&
           wire::ParseAck({buffer.data(), message.length}, kNonce, kKey, ack) ==
               wire::WireError::kOk;
  }

  ScopedFd exporter_;
  Seen seen_;
  std::unique_ptr<WatchClient> client_;
};

TEST_F(WatchClientTest, AnUnfollowedEventIsHandedOnAckedAndEndsTheConnection) {
  wire::Event event;
  event.kind = EventKind::kUnfollowed;
  event.sequence = 1;
  const auto bytes = wire::EncodeEvent(event, kNonce, kKey);
  ASSERT_TRUE(SendMessage(exporter_.get(), bytes, {}, Deadline::AfterMs(1000)).ok());
  ASSERT_TRUE(seen_.WaitFor(1));
  EXPECT_EQ(seen_.kinds[0], EventKind::kUnfollowed);
  EXPECT_TRUE(ClosedByClient());
  EXPECT_FALSE(client_->Has(kTag));
}

TEST_F(WatchClientTest, AnEventOutOfProtocolMakesCoreDropWhatItHoldsOfThatExporter) {
  const uint8_t garbage[48] = {1, 2, 3};
  ASSERT_TRUE(SendMessage(exporter_.get(), garbage, {}, Deadline::AfterMs(1000)).ok());
  ASSERT_TRUE(seen_.WaitFor(1)) << "the handler was not told that follow ended";
  EXPECT_EQ(seen_.kinds[0], EventKind::kUnfollowed);
  EXPECT_TRUE(ClosedByClient());
}

// A resume whose fd is a socket (whose last close would wait 30 s) is no
// device memory: out of protocol, refused before the handler sees it, and
// not closed on the follow thread, which goes on at once.
TEST_F(WatchClientTest, AResumeWhoseFdIsALingeringSocketIsOutOfProtocolAndWaitsForNothing) {
  ScopedFd keep_listener, keep_server;
  ScopedFd lingering = testing::LingeringSocket(30, &keep_listener, &keep_server);
  wire::Event event;
  event.kind = EventKind::kResume;
  event.sequence = 1;
  const auto bytes = wire::EncodeEvent(event, kNonce, kKey);
  const int fds[1] = {lingering.get()};
  ASSERT_TRUE(SendMessage(exporter_.get(), bytes, fds, Deadline::AfterMs(1000)).ok());
  lingering.Reset();  // the client's copy is the last
  ASSERT_TRUE(seen_.WaitFor(1));
  EXPECT_EQ(seen_.kinds[0], EventKind::kUnfollowed) << "the socket was taken as memory";
  EXPECT_TRUE(ClosedByClient());
}

TEST_F(WatchClientTest, AnExporterThatHungUpIsForgottenWithoutDroppingAnything) {
  exporter_.Reset();  // the exporter exited: its memory stays valid here
  for (int i = 0; i < 500 && client_->Has(kTag); ++i) usleep(10000);
  EXPECT_FALSE(client_->Has(kTag));
  std::lock_guard<std::mutex> lock(seen_.mutex);
  EXPECT_TRUE(seen_.kinds.empty());
}

// Ahead: core drops what it mapped ahead of an exporter once nothing would
// tell it of that exporter's unmaps; the client says when a connection ended,
// after it forgot it (an open that looks then sees no watch connection).
TEST_F(WatchClientTest, AnEndedConnectionIsToldOnceItIsForgotten) {
  exporter_.Reset();
  std::unique_lock<std::mutex> lock(g_ended.mutex);
  ASSERT_TRUE(g_ended.changed.wait_for(lock, std::chrono::seconds(5),
                                       [] { return !g_ended.tags.empty(); }));
  EXPECT_EQ(g_ended.tags, std::vector<uint64_t>{kTag});
  EXPECT_FALSE(client_->Has(kTag));
}

// An event of `kind` about the chunk at 0x200000, numbered `sequence` (with
// a handle, which only an announcement's layout carries).
wire::Event ChunkEvent(EventKind kind, uint32_t sequence) {
  wire::Event event;
  event.kind = kind;
  event.sequence = sequence;
  event.base = 0x200000;
  event.size = 0x200000;
  event.generation = 5;
  for (size_t i = 0; i < event.handle.size(); ++i) event.handle[i] = static_cast<uint8_t>(i * 3);
  return event;
}

// Announcements (issue 37): the longer event reaches core with its handle,
// and is acked with core's answer, in order with the other events.
TEST_F(WatchClientTest, AnAnnouncementReachesCoreWithItsHandleAndIsAckedWithItsAnswer) {
  const wire::Event announce = ChunkEvent(EventKind::kAnnounce, 1);
  const auto bytes = wire::EncodeAnnounce(announce, kNonce, kKey);
  ASSERT_TRUE(SendMessage(exporter_.get(), bytes, {}, Deadline::AfterMs(1000)).ok());
  const wire::Event pause = ChunkEvent(EventKind::kPause, 2);
  const auto pause_bytes = wire::EncodeEvent(pause, kNonce, kKey);
  ASSERT_TRUE(SendMessage(exporter_.get(), pause_bytes, {}, Deadline::AfterMs(1000)).ok());
  wire::Ack ack;
  ASSERT_TRUE(ReadAck(&ack));
  EXPECT_EQ(ack.sequence, 1u);
  EXPECT_EQ(ack.status, wire::AckStatus::kNotHeld);
  ASSERT_TRUE(ReadAck(&ack));
  EXPECT_EQ(ack.sequence, 2u);
  EXPECT_EQ(ack.status, wire::AckStatus::kDone);
  ASSERT_TRUE(seen_.WaitFor(2));
  std::lock_guard<std::mutex> lock(seen_.mutex);
  EXPECT_EQ(seen_.kinds, (std::vector<EventKind>{EventKind::kAnnounce, EventKind::kPause}));
  EXPECT_EQ(seen_.events[0].handle, announce.handle);
  EXPECT_EQ(seen_.events[0].base, 0x200000u);
  EXPECT_EQ(seen_.events[0].generation, 5u);
  EXPECT_TRUE(client_->Has(kTag));
}

// A pause in the announcement's layout (a record of neither layout) is out
// of protocol: core is told it is no longer followed, the connection ends.
TEST_F(WatchClientTest, AnEventInTheOtherLayoutIsOutOfProtocol) {
  const auto bytes = wire::EncodeAnnounce(ChunkEvent(EventKind::kPause, 1), kNonce, kKey);
  ASSERT_TRUE(SendMessage(exporter_.get(), bytes, {}, Deadline::AfterMs(1000)).ok());
  ASSERT_TRUE(seen_.WaitFor(1));
  EXPECT_EQ(seen_.kinds[0], EventKind::kUnfollowed);
  EXPECT_TRUE(ClosedByClient());
}

// One follow thread serves every exporter (issue 43): an exporter that sends
// events and stops reading their acks must not hold it. With a timeout far
// longer than the test's bound, exporter A fills its connection with acks it
// never reads; exporter B's pause is acked all the same, within the bound,
// and A loses its follow (core is told: kUnfollowed), once. Before acks were
// queued, the thread sat in A's send for the whole timeout.
TEST(WatchClientAcks, AnExporterThatStopsReadingItsAcksDelaysNoOtherExporter) {
  constexpr uint64_t kTagA = (uint64_t{51} << 32) | 1;
  constexpr uint64_t kTagB = (uint64_t{52} << 32) | 2;
  struct {
    std::mutex mutex;
    std::condition_variable changed;
    std::vector<std::pair<uint64_t, EventKind>> seen;
  } log;
  WatchClient client(
      [&](uint64_t tag, const wire::Event& event, ScopedFd) {
        std::lock_guard<std::mutex> lock(log.mutex);
        log.seen.emplace_back(tag, event.kind);
        log.changed.notify_all();
        return wire::AckStatus::kDone;
      },
      Timeout::Ms(600000));
  auto [client_a, exporter_a] = SeqpacketPair();
  auto [client_b, exporter_b] = SeqpacketPair();
  // A's side takes few acks before its socket is full (the kernel's minimum).
  const int small = 0;
  ASSERT_EQ(setsockopt(client_a.get(), SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)), 0);
  std::string error;
  for (auto& [tag, fd] : {std::pair{kTagA, &client_a}, std::pair{kTagB, &client_b}}) {
    WatchConnection connection;
    connection.fd = std::move(*fd);
    connection.key = kKey;
    connection.nonce = kNonce;
    ASSERT_TRUE(client.Add(tag, std::move(connection), &error)) << error;
  }
  // A: events until its connection is closed (or its sends stall), acks never read.
  int sent_a = 0;
  for (uint32_t sequence = 1; sequence <= 4096; ++sequence, ++sent_a) {
    const auto bytes = wire::EncodeEvent(ChunkEvent(EventKind::kPause, sequence), kNonce, kKey);
    if (!SendMessage(exporter_a.get(), bytes, {}, Deadline::AfterMs(2000)).ok()) break;
  }
  EXPECT_GT(sent_a, 256);
  // B: one pause, acked within the bound whatever A does.
  const auto bytes = wire::EncodeEvent(ChunkEvent(EventKind::kPause, 1), kNonce, kKey);
  ASSERT_TRUE(SendMessage(exporter_b.get(), bytes, {}, Deadline::AfterMs(1000)).ok());
  std::vector<uint8_t> buffer(wire::kAckSize + 1);
  ReceivedMessage message;
  ASSERT_TRUE(ReceiveMessage(exporter_b.get(), buffer, &message, Deadline::AfterMs(10000)).ok())
      << "exporter B's ack waited for exporter A";
  wire::Ack ack;
  ASSERT_EQ(wire::ParseAck({buffer.data(), message.length}, kNonce, kKey, &ack),
            wire::WireError::kOk);
  EXPECT_EQ(ack.sequence, 1u);
  EXPECT_FALSE(client.Has(kTagA)) << "A kept its follow without reading its acks";
  EXPECT_TRUE(client.Has(kTagB));
  std::lock_guard<std::mutex> lock(log.mutex);
  const auto unfollowed_a =
      std::count(log.seen.begin(), log.seen.end(), std::pair{kTagA, EventKind::kUnfollowed});
  EXPECT_EQ(unfollowed_a, 1) << "core was not told, once, that A is no longer followed";
}

}  // namespace
}  // namespace vmmipc::transport
