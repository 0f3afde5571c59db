// The importer's side of one exchange, as named steps over one Fetch: connect
// (and check who listens), send the MAC'd request, receive and verify every
// reply batch and its fds, check the chunks, hand them over. Every wait of
// every step is bounded by the fetch's one deadline, never by one of its
// own. Any failure closes every fd received so far (they live in ScopedFd
// throughout, and go to the reaper: none is closed on the caller's thread).
#include "transport/client/fetch_client.h"

#include <unistd.h>

#include <algorithm>
#include <optional>

#include "common/elapsed.h"
#include "common/log.h"
#include "common/random.h"
#include "common/syscall.h"
#include "transport/client/fetch_state.h"
#include "transport/client/warm_connections.h"
#include "transport/reaper/fd_reaper.h"
#include "transport/socket_address.h"
#include "transport/socket_io.h"
#include "transport/socket_uid.h"
#include "transport/wire.h"

namespace vmmipc::transport {
namespace fetch_internal {

FetchResult Fail(FetchStatus status, std::string detail) {
  FetchResult result;
  result.status = status;
  result.detail = std::move(detail);
  return result;
}

// Maps a socket-level failure while talking to the exporter.
FetchResult IoFailure(const IoResult& io, const std::string& what, const Fetch& fetch) {
  const std::string& name = fetch.address.display;
  switch (io.status) {
    case IoStatus::kTimeout:
      return Fail(FetchStatus::kTimeout,
                  fmt::format("{} on {}: no answer within {} ms", what, name, fetch.timeout_ms));
    case IoStatus::kNoResources:
      return Fail(FetchStatus::kNoResources,
                  fmt::format("{} on {}: {}", what, name, ErrnoText(io.error)));
    case IoStatus::kPeerClosed:
      return Fail(FetchStatus::kProtocolError,
                  fmt::format("{} on {}: the exporter closed the connection", what, name));
    default:
      return Fail(FetchStatus::kProtocolError,
                  fmt::format("{} on {}: {}", what, name, ErrnoText(io.error)));
  }
}

}  // namespace fetch_internal

namespace {

using fetch_internal::Ended;
using fetch_internal::Fail;
using fetch_internal::Fetch;
using fetch_internal::IoFailure;
using fetch_internal::ReceiveReply;

// Why nobody may listen under the exporter's name, in the order they happen:
// it exited; it runs in another network namespace (a container without
// --network=host: abstract names do not cross, a shared VMMIPC_SOCKET_DIR
// does) or uses another socket directory; it runs as another user (of the
// host, once user namespaces are mapped: socket_uid.h).
std::string NoListenerReasons(const Fetch& fetch) {
  const uint32_t name_uid = SocketNameUid(fetch.uid);
  std::string user = fmt::format("or runs as another uid than {}", name_uid);
  if (name_uid != fetch.uid) {
    user += fmt::format(" (this process is uid {} in a user namespace, uid {} outside it)",
                        fetch.uid, name_uid);
  }
  const std::string where =
      fetch.address.abstract
          ? "or runs in another network namespace, which abstract socket names do not reach "
            "(set VMMIPC_SOCKET_DIR to a directory both processes see)"
          : "or uses another VMMIPC_SOCKET_DIR";
  return fmt::format("the exporter (pid {} as its own pid namespace numbers it) has exited, {}, {}",
                     fetch.request.handle.exporter_pid, where, user);
}

// The name of the handle's exporter: its instance (a version 2 handle: its
// pid); first of all, whether the reaper can take what this fetch may be sent.
Ended Address(Fetch& fetch) {
  // The reaper's threads are stuck and what it is handed now stays open in
  // this table (fd_reaper.h): a peer's answer could add more. Refused at
  // once, until they come back; a warm connection's answer too.
  if (!ReaperTakesMore()) {
    return Fail(FetchStatus::kNoResources,
                "the fd reaper takes no more (its threads are stuck in closes that do not "
                "return, a peer's FUSE file or terminal); refusing to take a peer's fds until "
                "they come back");
  }
  std::string error;
  const FetchRequest& request = fetch.request;
  const SocketOwner owner = request.exporter_instance != 0
                                ? SocketOwner::Instance(request.exporter_instance)
                                : SocketOwner::Pid(request.handle.exporter_pid);
  if (!MakeSocketAddress(fetch.uid, owner, fetch.options.socket_dir, &fetch.address, &error)) {
    return Fail(FetchStatus::kNoExporter, error);
  }
  return std::nullopt;
}

// A kept connection to that name, if there is one fit for a request: its
// exporter's credentials were checked when it was made, and SO_PEERCRED
// does not change for the life of a connection.
bool TakeWarm(Fetch& fetch) {
  if (fetch.options.warm_connections == 0) return false;
  fetch.sock = TakeWarmConnection(fetch.address.display);
  if (!fetch.sock.valid()) return false;
  fetch.in_use.Note(fetch.sock.get());
  fetch.reused = true;
  fetch.connected = SteadyClock::now();
  return true;
}

// Connects to that name, then checks who holds it before saying anything to
// it: another user's process squatting the name gets not even our request.
Ended Connect(Fetch& fetch) {
  if (IoResult io = ConnectSeqpacket(fetch.address, fetch.deadline, &fetch.sock); !io.ok()) {
    if (io.status == IoStatus::kError &&
        (io.error == ECONNREFUSED || io.error == ENOENT || io.error == ENOTDIR)) {
      return Fail(FetchStatus::kNoExporter,
                  fmt::format("nobody listens on {}: {}; {}", fetch.address.display,
                              ErrnoText(io.error), NoListenerReasons(fetch)));
    }
    return IoFailure(io, "connecting", fetch);
  }
  fetch.in_use.Note(fetch.sock.get());
  fetch.connected = SteadyClock::now();
  PeerCredentials server;
  if (IoResult io = GetPeerCredentials(fetch.sock.get(), &server); !io.ok()) {
    return IoFailure(io, "reading the exporter's credentials", fetch);
  }
  if (server.uid != fetch.uid) {
    return Fail(FetchStatus::kUnauthentic,
                fmt::format("{} is held by {} of uid {}, not by our uid {}", fetch.address.display,
                            PeerPidText(server.pid), server.uid, fetch.uid));
  }
  // The overflow uid is every unmapped user's (socket_uid.h): never ours.
  if (IsOverflowUid(server.uid)) {
    return Fail(FetchStatus::kUnauthentic,
                fmt::format("{} is held by {} of the overflow uid {}, which every user without "
                            "a mapping in this process's user namespace reads as: not taken for "
                            "our own",
                            fetch.address.display, PeerPidText(server.pid), server.uid));
  }
  return std::nullopt;
}

// Sends every field of the handle, MAC'd under its capability, with a fresh nonce.
Ended SendRequest(Fetch& fetch) {
  const FetchRequest& request = fetch.request;
  wire::Request wire_request;
  const ClientOptions& options = fetch.options;
  wire_request.flags =
      static_cast<uint16_t>((options.watch ? wire::kRequestFlagWatch : 0) |
                            (options.watch && options.announce ? wire::kRequestFlagAnnounce : 0));
  wire_request.follower = fetch.options.follower;
  wire_request.handle = request.handle;
  // 128 bits that make this exchange's reply MACs its own: random from the
  // kernel, else (a seccomp policy refusing getrandom, no /dev/urandom) only
  // unique, which is what a nonce needs (docs/security.md).
  FillUnique(wire_request.nonce.data(), wire_request.nonce.size());
  fetch.nonce = wire_request.nonce;
  fetch.key = wire::DeriveKey(request.capability, request.handle.exporter_pid);
  const auto request_bytes = wire::EncodeRequest(wire_request, fetch.key);
  if (IoResult io = SendMessage(fetch.sock.get(), request_bytes, {}, fetch.deadline); !io.ok()) {
    fetch.warm_lost = fetch.reused && io.status == IoStatus::kPeerClosed;
    return IoFailure(io, "sending the request", fetch);
  }
  return std::nullopt;
}

// The verified chunks to the caller, and with options.watch the connection too.
FetchResult HandOver(Fetch& fetch) {
  FetchResult result;
  result.status = FetchStatus::kOk;
  result.verified = true;
  result.chunks = std::move(fetch.chunks);
  fetch.chunks.clear();  // moved from: nothing left for ~Fetch to reap
  result.connect_us = MicrosBetween(fetch.start, fetch.connected);
  result.answer_us = MicrosSince(fetch.connected);
  result.warm = fetch.reused;
  fetch.in_use.Forget();  // the watch client's or the pool's from here on
  if (fetch.options.watch) {
    // The answer verified: this connection is the exporter's. Kept for its events.
    result.watch.fd = std::move(fetch.sock);
    result.watch.key = fetch.key;
    result.watch.nonce = fetch.nonce;
  } else {
    // A complete exchange, every batch verified and taken: nothing of this
    // one is left on the connection, which serves the next fetch.
    KeepWarmConnection(fetch.address.display, std::move(fetch.sock),
                       fetch.options.warm_connections);
  }
  return result;
}

// The request and its whole reply, on the fetch's connection.
Ended Exchange(Fetch& fetch) {
  if (Ended ended = SendRequest(fetch)) return ended;
  return ReceiveReply(fetch);
}

}  // namespace

const char* FetchStatusName(FetchStatus status) {
  switch (status) {
    case FetchStatus::kOk:
      return "ok";
#define VMMIPC_FETCH_NAME(id, name) \
  case FetchStatus::id:             \
    return name;
      VMMIPC_FETCH_FAILURES(VMMIPC_FETCH_NAME)
#undef VMMIPC_FETCH_NAME
  }
  return "unknown";
}

namespace {

// One exchange with the exporter: a kept connection if there is one (once
// more on a new one when it turns out closed), else a new connection.
FetchResult FetchOnce(const FetchRequest& request, const ClientOptions& options) try {
  Fetch fetch(request, options);
  if (Ended ended = Address(fetch)) return std::move(*ended);
  if (TakeWarm(fetch)) {
    Ended ended = Exchange(fetch);
    if (!ended) return HandOver(fetch);
    // The kept connection was closed by its exporter before it answered
    // (idle, over its budget, or it exited): the request was not served, so
    // it goes once more on a new connection, within the same deadline.
    if (!fetch.warm_lost) return std::move(*ended);
    CloseConnection(std::move(fetch.sock));
    fetch.reused = fetch.warm_lost = false;
  }
  if (Ended ended = Connect(fetch)) return std::move(*ended);
  if (Ended ended = Exchange(fetch)) return std::move(*ended);
  return HandOver(fetch);
} catch (const std::bad_alloc&) {
  return Fail(FetchStatus::kNoResources, "out of memory");
} catch (const std::exception& e) {
  return Fail(FetchStatus::kProtocolError, fmt::format("unexpected error: {}", e.what()));
} catch (...) {
  return Fail(FetchStatus::kProtocolError, "unexpected error");
}

}  // namespace

FetchResult FetchChunks(const FetchRequest& request, const ClientOptions& options) {
  const auto start = SteadyClock::now();
  ClientOptions asked = options;
  asked.announce = options.watch && options.announce;  // never sent without watch
  FetchResult result = FetchOnce(request, asked);
  // An exporter that does not know the flag (an older vmmipc) refuses it as
  // a bad request: asked again without it, within what is left of the one
  // deadline.
  if (asked.announce && result.status == FetchStatus::kRefused &&
      result.refuse == RefuseReason::kBadRequest && result.verified) {
    asked.announce = false;
    asked.timeout =
        Timeout::Ms(std::max<int64_t>(1, options.timeout.ms() - MicrosSince(start) / 1000));
    result = FetchOnce(request, asked);
    result.announce_refused = true;
  }
  return result;
}

}  // namespace vmmipc::transport
