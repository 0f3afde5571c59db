// A TCP socket on loopback whose last close() blocks: what a hostile peer
// passes as an fd to make whoever closes it last wait (issue 12).
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <vector>

#include "common/scoped_fd.h"

namespace vmmipc::testing {

// The client end of a loopback TCP connection whose last close() blocks for
// `linger_s` seconds: SO_LINGER on, and unsent data that the other end never
// reads. `keep_listener` and `keep_server` must stay open meanwhile.
inline ScopedFd LingeringSocket(int linger_s, ScopedFd* keep_listener, ScopedFd* keep_server) {
  ScopedFd listener(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  EXPECT_EQ(bind(listener.get(), reinterpret_cast<sockaddr*>(&address), length), 0);
  EXPECT_EQ(listen(listener.get(), 1), 0);
  EXPECT_EQ(getsockname(listener.get(), reinterpret_cast<sockaddr*>(&address), &length), 0);
  ScopedFd client(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  int small = 4096;
  setsockopt(client.get(), SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
  EXPECT_EQ(connect(client.get(), reinterpret_cast<sockaddr*>(&address), length), 0);
  ScopedFd server(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  setsockopt(server.get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  const linger lingering{1, linger_s};
  EXPECT_EQ(setsockopt(client.get(), SOL_SOCKET, SO_LINGER, &lingering, sizeof(lingering)), 0);
  std::vector<char> junk(1 << 16, 'x');
  while (send(client.get(), junk.data(), junk.size(), MSG_DONTWAIT | MSG_NOSIGNAL) > 0) {
  }
  *keep_listener = std::move(listener);
  *keep_server = std::move(server);  // never reads: the client's data stays unsent
  return client;
}

}  // namespace vmmipc::testing
