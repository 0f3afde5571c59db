// Fuzz target: the importer's whole exchange (transport/client/fetch_client.h,
// FetchChunks) against a scripted fake exporter on a real abstract socket:
// reply parsing, batch sequencing, fd accounting, the final overlap check.
// The fake exporter (a thread) reads the request, then sends the messages the
// input describes, each with the number of fds it says, and hangs up.
// Input: up to 12 messages, each: ctl u8 (bit 0: put the right MAC for this
// exchange's nonce, bit 1: hang up after this message), fd count u8 (at most
// 253), length u16 (at most 8192), then that many payload bytes.
// Invariants: no crash, no hang (bounded by the client's deadline); a grant
// is only returned whole, sorted, non-overlapping, one distinct valid fd per
// chunk; a refusal with a verified MAC names a reason; after the result is
// dropped the process holds exactly the fds it held before.
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <set>
#include <thread>

#include "fuzz_util.h"
#include "transport/client/fetch_client.h"
#include "transport/reaper/fd_reaper.h"
#include "transport/socket_address.h"
#include "transport/socket_io.h"

namespace vmmipc::fuzz {
namespace {

using namespace transport;

const SipKey kSecret{0x5eed5eed12345678ull, 0x0123456789abcdefull};  // the fake exporter's

// What the client asks for: the handle the fake exporter made.
transport::FetchRequest TheRequest(uint32_t pid) {
  transport::FetchRequest request;
  request.handle.exporter_pid = pid;
  request.handle.address = 0x7f0000201000ull;
  request.handle.chunk_base = 0x7f0000200000ull;
  request.handle.chunk_size = 0x200000;
  request.handle.region_base = 0x7f0000000000ull;
  request.handle.generation = 1;
  request.capability = wire::Capability(
      kSecret, {pid, request.handle.generation, request.handle.rank_slot, request.handle.address,
                request.handle.chunk_base, request.handle.chunk_size, request.handle.region_base});
  return request;
}
constexpr size_t kMaxMessages = 12;
constexpr size_t kMaxLength = 8192;

struct ScriptedMessage {
  uint8_t ctl = 0;
  uint8_t fds = 0;
  std::vector<uint8_t> bytes;
};

struct Fixture {
  uint32_t pid = 0;  // above pid_max: never a real process's name
  SipKey key;
  int listen_fd = -1;
  int memfd = -1;  // what the fake exporter's fds are dups of
};

Fixture& Fix() {
  static Fixture* fixture = [] {
    auto* f = new Fixture();
    f->pid = 0x20000000u + static_cast<uint32_t>(getpid());
    f->key = wire::DeriveKey(TheRequest(f->pid).capability, f->pid);
    SocketAddress address;
    std::string error;
    FUZZ_CHECK(MakeSocketAddress(geteuid(), SocketOwner::Pid(f->pid), "", &address, &error));
    f->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    FUZZ_CHECK(f->listen_fd >= 0);
    FUZZ_CHECK(bind(f->listen_fd, address.get(), address.length) == 0);
    FUZZ_CHECK(listen(f->listen_fd, 4) == 0);
    f->memfd = memfd_create("fuzz-chunk", MFD_CLOEXEC);
    FUZZ_CHECK(f->memfd >= 0);
    return f;
  }();
  return *fixture;
}

// The fake exporter: one connection, the scripted messages, then hang up.
void FakeExporter(const std::vector<ScriptedMessage>& script) {
  const Fixture& f = Fix();
  ScopedFd conn(accept4(f.listen_fd, nullptr, nullptr, SOCK_CLOEXEC));
  FUZZ_CHECK(conn.valid());
  pollfd pfd{conn.get(), POLLIN, 0};
  if (poll(&pfd, 1, 5000) <= 0) return;
  uint8_t request[wire::kRequestSize + 1];
  const ssize_t n = recv(conn.get(), request, sizeof(request), 0);
  FUZZ_CHECK(n == static_cast<ssize_t>(wire::kRequestSize));  // the client's request is exact
  wire::Request parsed;
  FUZZ_CHECK(wire::ParseRequest(std::span<const uint8_t>(request, wire::kRequestSize), kSecret,
                                &parsed) == wire::WireError::kOk);
  for (const ScriptedMessage& m : script) {
    std::vector<uint8_t> bytes = m.bytes;
    if (m.ctl & 1) FixReplyMac(bytes, parsed.nonce, f.key);
    std::vector<ScopedFd> owned;
    std::vector<int> fds;
    for (int i = 0; i < m.fds; ++i) {
      owned.emplace_back(fcntl(f.memfd, F_DUPFD_CLOEXEC, 0));
      fds.push_back(owned.back().get());
    }
    // SOCK_SEQPACKET needs at least one byte to carry fds; an empty message is EOF to the client.
    if (bytes.empty()) bytes.push_back(0);
    const IoResult io = SendMessage(conn.get(), bytes, fds, Deadline::AfterMs(1000));
    if (!io.ok() || (m.ctl & 2)) break;
  }
}

void CheckResult(const FetchResult& r) {
  FUZZ_CHECK(FetchStatusName(r.status) != nullptr);
  if (r.status != FetchStatus::kOk) {
    FUZZ_CHECK(r.chunks.empty());
    if (r.status == FetchStatus::kRefused && r.verified)
      FUZZ_CHECK(r.refuse != RefuseReason::kNone);
    if (r.status == FetchStatus::kRefused && !r.verified)
      FUZZ_CHECK(r.refuse == RefuseReason::kBadToken);
    return;
  }
  FUZZ_CHECK(r.verified);
  FUZZ_CHECK(!r.chunks.empty() && r.chunks.size() <= wire::kMaxTotalChunks);
  std::set<int> fds;
  for (size_t i = 0; i < r.chunks.size(); ++i) {
    const ChunkGrant& c = r.chunks[i];
    FUZZ_CHECK(c.fd.valid() && fcntl(c.fd.get(), F_GETFD) == FD_CLOEXEC);
    FUZZ_CHECK(fds.insert(c.fd.get()).second);
    FUZZ_CHECK(c.size != 0 && c.address + c.size > c.address);
    if (i > 0) FUZZ_CHECK(r.chunks[i - 1].address + r.chunks[i - 1].size <= c.address);
  }
}

std::vector<uint8_t> Encode(const std::vector<ScriptedMessage>& script) {
  Writer w;
  for (const auto& m : script) {
    w.U8(m.ctl);
    w.U8(m.fds);
    w.U16(static_cast<uint16_t>(m.bytes.size()));
    w.Append(m.bytes);
  }
  return w.bytes;
}

void WriteSeeds() {
  const wire::Nonce any{};                   // the MAC is fixed at run time (ctl bit 0)
  const SipKey key = wire::DeriveKey(1, 1);  // any: the MAC is fixed at run time
  auto grant = [&](uint32_t total, uint32_t index, uint64_t base, size_t count) {
    wire::ReplyHeader h;
    h.total_chunks = total;
    h.batch_index = index;
    h.batch_count = wire::BatchCount(total);
    std::vector<wire::ReplyEntry> e;
    for (size_t i = 0; i < count; ++i) e.push_back({base + i * 0x200000, 0x200000, 1});
    return ScriptedMessage{1, static_cast<uint8_t>(count), wire::EncodeReply(any, key, h, e)};
  };
  WriteSeed("grant_3", Encode({grant(3, 0, 0x7f0000200000ull, 3)}));
  WriteSeed("grant_300_in_2_batches",
            Encode({grant(300, 0, 0x7f0000200000ull, 253),
                    grant(300, 1, 0x7f0000200000ull + 253 * 0x200000ull, 47)}));
  WriteSeed("grant_300_second_batch_missing", Encode({grant(300, 0, 0x7f0000200000ull, 253)}));
  ScriptedMessage wrong_fds = grant(3, 0, 0x7f0000200000ull, 3);
  wrong_fds.fds = 2;
  WriteSeed("grant_3_with_2_fds", Encode({wrong_fds}));
  ScriptedMessage overlap = grant(2, 0, 0x7f0000200000ull, 2);
  overlap.bytes[32 + 24] = overlap.bytes[32];  // second entry at the first's address
  for (int i = 0; i < 8; ++i) overlap.bytes[32 + 24 + i] = overlap.bytes[32 + i];
  WriteSeed("grant_overlapping", Encode({overlap}));
  wire::ReplyHeader refusal;
  refusal.status = static_cast<uint16_t>(RefuseReason::kFreed);
  refusal.batch_count = 1;
  WriteSeed("refusal_freed", Encode({{1, 0, wire::EncodeReply(any, key, refusal, {})}}));
  refusal.status = static_cast<uint16_t>(RefuseReason::kBadToken);
  WriteSeed("refusal_bad_token_unverified",
            Encode({{0, 0, wire::EncodeReply(any, key, refusal, {})}}));
  WriteSeed("hang_up_at_once", Encode({{2, 0, {}}}));
}

}  // namespace
}  // namespace vmmipc::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vmmipc::fuzz::WriteSeedsIfAsked(vmmipc::fuzz::WriteSeeds);
  vmmipc::fuzz::QuietLogs();
  vmmipc::fuzz::Fix();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vmmipc::fuzz;
  Reader in(data, size);
  std::vector<ScriptedMessage> script;
  while (!in.empty() && script.size() < kMaxMessages) {
    ScriptedMessage m;
    m.ctl = in.U8();
    m.fds = static_cast<uint8_t>(std::min<int>(in.U8(), 253));
    m.bytes = in.Bytes(std::min<size_t>(in.U16(), kMaxLength));
    script.push_back(std::move(m));
  }
  // The reaper keeps its inbox from its first use on: not a leak.
  const int fds_before =
      CountFds() - static_cast<int>(vmmipc::transport::ReaperHostFdsForTesting());
  {
    std::thread exporter(FakeExporter, std::cref(script));
    const vmmipc::transport::FetchRequest request = TheRequest(Fix().pid);
    const vmmipc::transport::FetchResult result =
        vmmipc::transport::FetchChunks(request, {"", vmmipc::Timeout::Ms(5000)});
    exporter.join();
    if (std::getenv("FUZZ_VERBOSE") != nullptr)  // what each input led to, for seed work
      std::fprintf(stderr, "fetch: %s (%zu chunks) %s\n",
                   vmmipc::transport::FetchStatusName(result.status), result.chunks.size(),
                   result.detail.c_str());
    CheckResult(result);
  }
  // Connections that may hold a peer's fds are closed by the reaper thread.
  for (int i = 0; i < 1000 && vmmipc::transport::ReaperPendingForTesting() > 0; ++i) usleep(1000);
  FUZZ_CHECK(CountFds() - static_cast<int>(vmmipc::transport::ReaperHostFdsForTesting()) ==
             fds_before);
  return 0;
}
