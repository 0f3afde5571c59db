// Socket naming: the abstract name's exact bytes and length, the filesystem
// path, and the sun_path limit.
#include <gtest/gtest.h>

#include <cstddef>
#include <string>

#include "transport/socket_address.h"

namespace vmmipc::transport {
namespace {

TEST(TransportSocketAddress, AbstractNameHasExactLength) {
  SocketAddress a;
  std::string error;
  ASSERT_TRUE(MakeSocketAddress(1000, 4242, "", &a, &error)) << error;
  EXPECT_TRUE(a.abstract);
  EXPECT_EQ(a.display, "@vmmipc.1000.4242");
  EXPECT_EQ(a.sockaddr.sun_family, AF_UNIX);
  EXPECT_EQ(a.sockaddr.sun_path[0], '\0');
  const std::string name = "vmmipc.1000.4242";
  EXPECT_EQ(std::string(a.sockaddr.sun_path + 1, name.size()), name);
  EXPECT_EQ(a.length, offsetof(sockaddr_un, sun_path) + 1 + name.size());
  EXPECT_TRUE(a.path.empty());
}

TEST(TransportSocketAddress, FilesystemPath) {
  SocketAddress a;
  std::string error;
  ASSERT_TRUE(MakeSocketAddress(7, 9, "/run/vmmipc/", &a, &error)) << error;
  EXPECT_FALSE(a.abstract);
  EXPECT_EQ(a.path, "/run/vmmipc/vmmipc.7.9.sock");
  EXPECT_EQ(a.display, a.path);
  EXPECT_STREQ(a.sockaddr.sun_path, "/run/vmmipc/vmmipc.7.9.sock");
  EXPECT_EQ(a.length, offsetof(sockaddr_un, sun_path) + a.path.size() + 1);
  ASSERT_TRUE(MakeSocketAddress(7, 9, "/", &a, &error)) << error;
  EXPECT_EQ(a.path, "/vmmipc.7.9.sock");
}

TEST(TransportSocketAddress, DifferentUidOrPidDifferentName) {
  EXPECT_NE(SocketBaseName(1, 2), SocketBaseName(2, 1));
  EXPECT_NE(SocketBaseName(1, 2), SocketBaseName(1, 3));
  EXPECT_NE(SocketBaseName(11, 2), SocketBaseName(1, 12));
}

TEST(TransportSocketAddress, TooLongPathIsAnError) {
  SocketAddress a;
  std::string error;
  EXPECT_FALSE(
      MakeSocketAddress(4294967295u, 4294967295u, "/" + std::string(100, 'd'), &a, &error));
  EXPECT_NE(error.find("longer"), std::string::npos) << error;
}

}  // namespace
}  // namespace vmmipc::transport
