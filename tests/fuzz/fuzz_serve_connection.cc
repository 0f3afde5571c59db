// Fuzz target: the exporter's whole handling of one connection
// (transport/serve/serve_connection.h, ServeConnection) fed arbitrary bytes through
// a socketpair, with a fuzzed handler answer: credentials, request parsing,
// the uid and MAC checks, the grant checks, batching and fd sending.
// Input: ctl u8 (bit 0: put the right MAC on the request; bit 1: keep the
// peer's write side open, so the server waits out its deadline; bit 2: the
// server serves another uid; bit 3: the listener is stopping; bit 4: send no
// request; bit 5: send a second message), request fd count u8 (mod 4),
// handler mode u8 (mod 8: 0-3 grant, 4 refuse, 5 throw std::exception, 6
// throw int, 7 grant nothing), refusal reason u8, chunk count u16 (mod 520),
// base u64, stride u64, size u64, invalid-fd index u16, shuffle seed u8,
// request length u16 (at most 600) and bytes, second message likewise.
// Invariants: no crash, no hang; the handler runs only for a request that
// verifies from our uid; nothing is sent without a parseable preamble or
// when stopping; another uid gets exactly one kWrongUser refusal; every
// message sent verifies under the request's nonce and is well formed, with
// one fd per entry; a valid grant arrives whole, in ascending address order;
// no fd is left behind.
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <random>
#include <stdexcept>

#include "fuzz_util.h"
#include "transport/reaper/fd_reaper.h"
#include "transport/serve/serve_connection.h"
#include "transport/socket_io.h"

namespace vmmipc::fuzz {
namespace {

using namespace transport;

const SipKey kSecret{0x5eed5eed12345678ull, 0x0123456789abcdefull};
constexpr uint32_t kPid = 4242;

// The key the server MACs its answers to `request` with: that of the handle
// the request names when it is of this version and long enough, else one
// nobody holds (serve_connection.cc).
SipKey AnswerKey(std::span<const uint8_t> request, uint32_t pid) {
  wire::Request claimed;
  return wire::PeekRequestFields(request, &claimed) ? wire::KeyFor(kSecret, claimed.handle)
                                                    : wire::DeriveKey(0, pid);
}

struct HandlerSpec {
  uint8_t mode = 0;
  uint8_t reason = 0;
  uint16_t count = 0;
  uint64_t base = 0, stride = 0, size = 0;
  uint16_t invalid_index = 0xffff;
  uint8_t shuffle = 0;
};

int Memfd() {
  static int fd = memfd_create("fuzz-chunk", MFD_CLOEXEC);
  return fd;
}

// The grants the handler returns, and whether the server must accept them.
std::vector<ChunkGrant> MakeGrants(const HandlerSpec& spec, bool* valid) {
  std::vector<ChunkGrant> chunks;
  for (uint16_t i = 0; i < spec.count; ++i) {
    ChunkGrant g;
    g.address = spec.base + uint64_t{i} * spec.stride;
    g.size = spec.size;
    g.generation = i;
    if (i != spec.invalid_index) g.fd.Reset(fcntl(Memfd(), F_DUPFD_CLOEXEC, 0));
    chunks.push_back(std::move(g));
  }
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& c : chunks) ranges.emplace_back(c.address, c.size);
  std::sort(ranges.begin(), ranges.end());
  *valid = !chunks.empty() && spec.invalid_index >= spec.count;
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (ranges[i].second == 0 || ranges[i].first + ranges[i].second < ranges[i].first)
      *valid = false;
    if (i > 0 && ranges[i - 1].first + ranges[i - 1].second > ranges[i].first) *valid = false;
  }
  std::shuffle(chunks.begin(), chunks.end(), std::minstd_rand(spec.shuffle));
  return chunks;
}

void WriteSeeds();

}  // namespace
}  // namespace vmmipc::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vmmipc::fuzz::WriteSeedsIfAsked(vmmipc::fuzz::WriteSeeds);
  vmmipc::fuzz::QuietLogs();
  (void)vmmipc::fuzz::Memfd();  // before any fd count
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vmmipc;
  using namespace vmmipc::fuzz;
  using namespace vmmipc::transport;
  Reader in(data, size);
  const uint8_t ctl = in.U8();
  const int request_fds = in.U8() % 4;
  HandlerSpec spec;
  spec.mode = in.U8() % 8;
  spec.reason = in.U8();
  spec.count = in.U16() % 520;
  spec.base = in.U64();
  spec.stride = in.U64();
  spec.size = in.U64();
  spec.invalid_index = in.U16();
  spec.shuffle = in.U8();
  std::vector<uint8_t> request = in.Bytes(std::min<uint16_t>(in.U16(), 600));
  std::vector<uint8_t> second = in.Bytes(std::min<uint16_t>(in.U16(), 600));
  if (ctl & 1) FixRequestMac(request, kSecret);

  // The reaper keeps its inbox from its first use on: not a leak.
  const int fds_before =
      CountFds() - static_cast<int>(vmmipc::transport::ReaperHostFdsForTesting());
  {
    int pair[2];
    FUZZ_CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) == 0);
    ScopedFd client(pair[0]);
    ScopedFd server(pair[1]);
    ScopedFd stop(eventfd(ctl & 8 ? 1 : 0, EFD_CLOEXEC | EFD_NONBLOCK));

    if (!(ctl & 16)) {
      std::vector<ScopedFd> owned;
      std::vector<int> fds;
      for (int i = 0; i < request_fds; ++i) {
        owned.emplace_back(fcntl(Memfd(), F_DUPFD_CLOEXEC, 0));
        fds.push_back(owned.back().get());
      }
      if (request.empty()) request.push_back(0);  // an empty message would read as EOF
      FUZZ_CHECK(SendMessage(client.get(), request, fds, Deadline::AfterMs(1000)).ok());
      if ((ctl & 32) && !second.empty())
        FUZZ_CHECK(SendMessage(client.get(), second, {}, Deadline::AfterMs(1000)).ok());
    }
    if (!(ctl & 2)) shutdown(client.get(), SHUT_WR);

    int handler_calls = 0;
    bool grants_valid = false;
    ServeHandler handler = [&](const ServeRequest&) -> ServeReply {
      ++handler_calls;
      ServeReply reply;
      switch (spec.mode) {
        case 4:
          reply.refuse = static_cast<RefuseReason>(spec.reason % 9);
          if (reply.refuse == RefuseReason::kNone) reply.chunks = MakeGrants(spec, &grants_valid);
          break;
        case 5:
          throw std::runtime_error("fuzzed handler failure");
        case 6:
          throw 42;
        case 7:
          break;
        default:
          reply.chunks = MakeGrants(spec, &grants_valid);
      }
      return reply;
    };
    ServeContext context;
    context.secret = kSecret;
    context.uid = geteuid() + (ctl & 4 ? 1 : 0);
    context.timeout = Timeout::Ms(20);
    context.stop_fd = stop.get();
    context.handler = &handler;
    context.name = "@fuzz";
    ServeConnection(std::move(server), context);

    // What a request that the handler may see looks like.
    wire::RequestPreamble preamble;
    const bool sent = !(ctl & 16);
    const bool has_preamble =
        sent && wire::ParseRequestPreamble(request, &preamble) == wire::WireError::kOk;
    wire::Request parsed;
    const bool verifies = has_preamble && request_fds == 0 &&
                          wire::ParseRequest(request, kSecret, &parsed) == wire::WireError::kOk;
    const bool stopping = ctl & 8;
    const bool wrong_uid = ctl & 4;
    FUZZ_CHECK(handler_calls == ((verifies && !wrong_uid && !stopping) ? 1 : 0));

    // Everything the server sent: each message must verify and be well formed.
    std::vector<uint8_t> buffer(wire::kMaxReplySize + 1);
    uint32_t next_batch = 0, batches = 1, total = 0, entries_seen = 0;
    uint64_t last_address = 0;
    bool refused = false;
    uint16_t refusal = 0;
    for (;;) {
      ReceivedMessage m;
      const IoResult io = ReceiveMessage(client.get(), buffer, &m, Deadline::AfterMs(1000));
      // A server that closes with our second message unread resets the
      // connection: the error comes first, the queued reply after it.
      if (io.status == IoStatus::kPeerClosed && io.error == ECONNRESET) continue;
      if (io.status == IoStatus::kPeerClosed) break;
      FUZZ_CHECK(io.ok());
      FUZZ_CHECK(has_preamble && !stopping);
      FUZZ_CHECK(!m.truncated && !m.control_truncated);
      wire::ReplyHeader h;
      std::vector<wire::ReplyEntry> entries;
      FUZZ_CHECK(wire::ParseReply(std::span<const uint8_t>(buffer.data(), m.length), preamble.nonce,
                                  AnswerKey(request, preamble.exporter_pid), &h,
                                  &entries) == wire::WireError::kOk);
      FUZZ_CHECK(m.fds.size() == entries.size());
      FUZZ_CHECK(!refused);  // a refusal is the only message
      if (h.status != 0) {
        FUZZ_CHECK(next_batch == 0);
        refused = true;
        refusal = h.status;
        continue;
      }
      FUZZ_CHECK(h.batch_index == next_batch);
      if (next_batch == 0) {
        batches = h.batch_count;
        total = h.total_chunks;
      }
      FUZZ_CHECK(h.total_chunks == total && h.batch_count == batches);
      for (const auto& e : entries) {
        FUZZ_CHECK(entries_seen == 0 || e.address >= last_address);
        last_address = e.address + e.size;
        ++entries_seen;
      }
      ++next_batch;
    }
    if (wrong_uid && has_preamble && !stopping) {
      FUZZ_CHECK(refused && refusal == static_cast<uint16_t>(RefuseReason::kWrongUser));
    }
    if (handler_calls == 1 && spec.mode <= 3) {
      // A valid grant arrives whole; an invalid one is refused as kInternal.
      if (grants_valid) {
        FUZZ_CHECK(!refused && next_batch == batches && entries_seen == spec.count);
      } else {
        FUZZ_CHECK(refused && refusal == static_cast<uint16_t>(RefuseReason::kInternal));
      }
    }
  }
  // Connections that may hold a peer's fds are closed by the reaper thread.
  for (int i = 0; i < 1000 && vmmipc::transport::ReaperPendingForTesting() > 0; ++i) usleep(1000);
  FUZZ_CHECK(CountFds() - static_cast<int>(vmmipc::transport::ReaperHostFdsForTesting()) ==
             fds_before);
  return 0;
}

namespace vmmipc::fuzz {
namespace {

std::vector<uint8_t> Seed(uint8_t ctl, uint8_t mode, uint16_t count, uint64_t size,
                          std::span<const uint8_t> request) {
  Writer w;
  w.U8(ctl);
  w.U8(0);  // request fds
  w.U8(mode);
  w.U8(static_cast<uint8_t>(RefuseReason::kFreed));
  w.U16(count);
  w.U64(0x7f0000200000ull);
  w.U64(0x200000);
  w.U64(size);
  w.U16(0xffff);
  w.U8(7);
  w.U16(static_cast<uint16_t>(request.size()));
  w.Append(request);
  w.U16(0);
  return w.bytes;
}

void WriteSeeds() {
  wire::Request r;
  r.handle.exporter_pid = kPid;
  for (size_t i = 0; i < r.nonce.size(); ++i) r.nonce[i] = static_cast<uint8_t>(i * 3);
  r.handle.address = 0x7f0000201000ull;
  r.handle.chunk_base = 0x7f0000200000ull;
  r.handle.generation = 1;
  const auto request = wire::EncodeRequest(r, wire::KeyFor(kSecret, r.handle));
  WriteSeed("grant_3", Seed(0, 0, 3, 0x200000, request));
  WriteSeed("grant_300_two_batches", Seed(0, 0, 300, 0x200000, request));
  WriteSeed("grant_overlapping_refused", Seed(0, 0, 3, 0x400000, request));
  WriteSeed("handler_refuses", Seed(0, 4, 0, 0, request));
  WriteSeed("handler_throws", Seed(0, 5, 0, 0, request));
  WriteSeed("wrong_uid", Seed(4, 0, 3, 0x200000, request));
  WriteSeed("stopping", Seed(8, 0, 3, 0x200000, request));
  WriteSeed("silent_peer", Seed(2 | 16, 0, 3, 0x200000, request));
  WriteSeed("half_request", Seed(0, 0, 3, 0x200000, std::span<const uint8_t>(request.data(), 20)));
  auto bad = request;
  bad[40] ^= 1;  // chunk base changed, MAC not: forged
  WriteSeed("forged_request", Seed(0, 0, 3, 0x200000, bad));
}

}  // namespace
}  // namespace vmmipc::fuzz
