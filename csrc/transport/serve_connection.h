// The exporter's side of one exchange, on one accepted connection: read the
// request, check the peer's uid and the request's MAC, ask the handler, send
// the MAC'd reply batches with their fds. The listener owns sockets and the
// thread; this owns what happens between accept() and close().
#pragma once

#include <cstdint>
#include <string>

#include "common/scoped_fd.h"
#include "transport/listener.h"
#include "transport/siphash.h"

namespace vmmipc::transport {

struct ServeContext {
  SipKey key;             // DeriveKey(token, pid)
  uint32_t uid = 0;       // the only uid served (this process's euid)
  int timeout_ms = 5000;  // receiving the request; then, afresh, sending the reply
  int stop_fd = -1;       // readable when the listener stops: abandon the connection
  const ServeHandler* handler = nullptr;
  std::string name;  // the listener's address, for log lines
  ListenerEvents events;
};

// Serves `connection` to the end and closes it. Never throws; every refusal
// is logged on one line with the peer, the address and the reason.
void ServeConnection(ScopedFd connection, const ServeContext& context) noexcept;

}  // namespace vmmipc::transport
