// Socket naming: the abstract name's exact bytes and length, the filesystem
// path, and the sun_path limit; the uid names carry (the parent user
// namespace's); and the socket directory's check.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <string>

#include "transport/socket_address.h"
#include "transport/socket_uid.h"

namespace vmmipc::transport {
namespace {

TEST(TransportSocketAddress, AbstractNameHasExactLength) {
  SocketAddress a;
  std::string error;
  ASSERT_TRUE(NameSocketAddress(1000, SocketOwner::Pid(4242), "", &a, &error)) << error;
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
  ASSERT_TRUE(NameSocketAddress(7, SocketOwner::Pid(9), "/run/vmmipc/", &a, &error)) << error;
  EXPECT_FALSE(a.abstract);
  EXPECT_EQ(a.path, "/run/vmmipc/vmmipc.7.9.sock");
  EXPECT_EQ(a.display, a.path);
  EXPECT_STREQ(a.sockaddr.sun_path, "/run/vmmipc/vmmipc.7.9.sock");
  EXPECT_EQ(a.length, offsetof(sockaddr_un, sun_path) + a.path.size() + 1);
  ASSERT_TRUE(NameSocketAddress(7, SocketOwner::Pid(9), "/", &a, &error)) << error;
  EXPECT_EQ(a.path, "/vmmipc.7.9.sock");
}

TEST(TransportSocketAddress, DifferentUidOrPidDifferentName) {
  EXPECT_NE(SocketBaseName(1, SocketOwner::Pid(2)), SocketBaseName(2, SocketOwner::Pid(1)));
  EXPECT_NE(SocketBaseName(1, SocketOwner::Pid(2)), SocketBaseName(1, SocketOwner::Pid(3)));
  EXPECT_NE(SocketBaseName(11, SocketOwner::Pid(2)), SocketBaseName(1, SocketOwner::Pid(12)));
}

// An exporter's socket is named by its instance id (handles of version 3),
// 8 hex digits after an "i", so that no pid's name (decimal digits, version
// 2) is ever the same, and every exporter's name has one length.
TEST(TransportSocketAddress, InstanceNamesAreFixedWidthAndNeverAPidsName) {
  EXPECT_EQ(SocketBaseName(1000, SocketOwner::Instance(0xabcd)), "vmmipc.1000.i0000abcd");
  EXPECT_EQ(SocketBaseName(1000, SocketOwner::Instance(0xffffffffu)), "vmmipc.1000.iffffffff");
  EXPECT_EQ(SocketBaseName(1000, SocketOwner::Pid(43981)), "vmmipc.1000.43981");
  EXPECT_NE(SocketBaseName(1, SocketOwner::Instance(2)), SocketBaseName(1, SocketOwner::Pid(2)));
  EXPECT_NE(SocketBaseName(1, SocketOwner::Instance(2)),
            SocketBaseName(2, SocketOwner::Instance(2)));
  SocketAddress a;
  std::string error;
  ASSERT_TRUE(NameSocketAddress(7, SocketOwner::Instance(9), "/run/vmmipc", &a, &error)) << error;
  EXPECT_EQ(a.path, "/run/vmmipc/vmmipc.7.i00000009.sock");
}

TEST(TransportSocketAddress, TooLongPathIsAnError) {
  SocketAddress a;
  std::string error;
  EXPECT_FALSE(MakeSocketAddress(4294967295u, SocketOwner::Pid(4294967295u),
                                 "/" + std::string(100, 'd'), &a, &error));
  EXPECT_NE(error.find("longer"), std::string::npos) << error;
}

// uid_map lines as /proc/self/uid_map shows them to the process itself.
TEST(TransportSocketUid, TheParentNamespacesUidIsTheOneInTheName) {
  // The initial user namespace: every uid is itself.
  EXPECT_EQ(ParentNamespaceUid(1000, "         0          0 4294967295\n"), 1000u);
  // `unshare --user --map-root-user` by uid 1000; rootless podman's
  // subordinate range beside it.
  const char* rootless = "         0       1000          1\n         1     100000      65536\n";
  EXPECT_EQ(ParentNamespaceUid(0, rootless), 1000u);
  EXPECT_EQ(ParentNamespaceUid(1, rootless), 100000u);
  EXPECT_EQ(ParentNamespaceUid(65536, rootless), 165535u);
  // Not mapped (65536 past the range's end), an empty map, garbage: itself.
  EXPECT_EQ(ParentNamespaceUid(65537, rootless), 65537u);
  EXPECT_EQ(ParentNamespaceUid(5, ""), 5u);
  EXPECT_EQ(ParentNamespaceUid(5, "x y z\n0 7"), 5u);
  // The last line without its newline still counts; one past 32 bits does not.
  EXPECT_EQ(ParentNamespaceUid(3, "0 10 4"), 13u);
  EXPECT_EQ(ParentNamespaceUid(1, "0 4294967295 2"), 1u);
}

TEST(TransportSocketUid, ThisProcessesOwnUidMapsAsItsUidMapSays) {
  // In the initial user namespace (CI, the GPU machine) the same number; in
  // a container of another uid map whatever it maps to, and always the same.
  const uint32_t named = SocketNameUid(geteuid());
  EXPECT_EQ(SocketNameUid(geteuid()), named);
  EXPECT_EQ(SocketNameUid(geteuid() + 1), SocketNameUid(geteuid() + 1));
  EXPECT_EQ(SocketNameUid(geteuid()), named) << "the cache kept another uid's answer";
}

class SocketDir : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/vmmipc-dir-test-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
  }
  void TearDown() override {
    ::unlink((dir_ + "/file").c_str());
    ::rmdir(dir_.c_str());
  }
  std::string dir_;
};

TEST_F(SocketDir, PrivateDirectoryOfTheUserIsAccepted) {
  std::string error;
  for (mode_t mode : {0700, 0755, 0500, 01700}) {
    ASSERT_EQ(::chmod(dir_.c_str(), mode), 0);
    EXPECT_TRUE(CheckSocketDir(dir_, geteuid(), &error)) << std::oct << mode << " " << error;
  }
  SocketAddress a;
  EXPECT_TRUE(MakeSocketAddress(geteuid(), SocketOwner::Pid(9), dir_ + "/", &a, &error)) << error;
  EXPECT_EQ(a.path,
            dir_ + "/" + SocketBaseName(SocketNameUid(geteuid()), SocketOwner::Pid(9)) + ".sock");
}

TEST_F(SocketDir, DirectoryOthersCanWriteIsRefused) {
  struct Case {
    mode_t mode;
    const char* says;
  };
  // 01777 is /dev/shm and /tmp: sticky, yet anyone can create a name first.
  for (const Case& c : {Case{0777, "is writable by group and others (mode 0777)"},
                        Case{01777, "is writable by group and others (mode 1777)"},
                        Case{0703, "is writable by others (mode 0703)"},
                        Case{0730, "is writable by its group (mode 0730)"}}) {
    ASSERT_EQ(::chmod(dir_.c_str(), c.mode), 0);
    std::string error;
    EXPECT_FALSE(CheckSocketDir(dir_, geteuid(), &error)) << std::oct << c.mode;
    EXPECT_EQ(error, "socket directory '" + dir_ + "' " + c.says +
                         ": another user could create socket names in it before vmmipc (the "
                         "sticky bit does not stop that); use a directory of your own that only "
                         "you can write (mode 0700)");
    // Both the listener and the client get their address through this.
    SocketAddress a;
    std::string make_error;
    EXPECT_FALSE(MakeSocketAddress(geteuid(), SocketOwner::Pid(9), dir_, &a, &make_error));
    EXPECT_EQ(make_error, error);
  }
}

TEST_F(SocketDir, DirectoryOfAnotherUserIsRefused) {
  std::string error;
  EXPECT_FALSE(CheckSocketDir(dir_, geteuid() + 1, &error));
  EXPECT_NE(error.find("belongs to uid " + std::to_string(geteuid()) +
                       ", not to this process's "
                       "uid " +
                       std::to_string(geteuid() + 1)),
            std::string::npos)
      << error;
}

TEST_F(SocketDir, MissingDirectoryOrFileIsRefused) {
  std::string error;
  EXPECT_FALSE(CheckSocketDir(dir_ + "/missing", geteuid(), &error));
  EXPECT_EQ(error,
            "socket directory '" + dir_ + "/missing' cannot be used: No such file or directory");
  const int fd = ::open((dir_ + "/file").c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  ::close(fd);
  EXPECT_FALSE(CheckSocketDir(dir_ + "/file", geteuid(), &error));
  EXPECT_NE(error.find("is not a directory"), std::string::npos) << error;
  // The abstract namespace has no directory to check.
  SocketAddress a;
  EXPECT_TRUE(MakeSocketAddress(geteuid(), SocketOwner::Pid(9), "", &a, &error));
}

TEST_F(SocketDir, SymlinkToAPrivateDirectoryIsFollowed) {
  const std::string link = dir_ + "/file";  // removed by TearDown
  char inner_template[] = "/tmp/vmmipc-dir-inner-XXXXXX";
  ASSERT_NE(mkdtemp(inner_template), nullptr);
  ASSERT_EQ(::symlink(inner_template, link.c_str()), 0);
  std::string error;
  EXPECT_TRUE(CheckSocketDir(link, geteuid(), &error)) << error;
  ASSERT_EQ(::chmod(inner_template, 0777), 0);
  EXPECT_FALSE(CheckSocketDir(link, geteuid(), &error));
  ::rmdir(inner_template);
}

}  // namespace
}  // namespace vmmipc::transport
