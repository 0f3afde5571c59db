// The listener's socket file: 0600 from the moment bind() creates it, and
// nothing after bind() follows a symlink swapped in at its path. This binary
// is linked with -Wl,--wrap=bind (tests/CMakeLists.txt), so the test can act
// in the window right after the real bind(), as a racing attacker would; it
// is its own binary so that no other test's bind() is wrapped.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "transport/client/fetch_client.h"
#include "transport/serve/listener/listener.h"
#include "transport/socket_address.h"
#include "transport/wire.h"

extern "C" int __real_bind(int fd, const sockaddr* address, socklen_t length);

namespace {

// What the wrapped bind() saw and did, for the filesystem sockets only.
std::atomic<bool> g_swap_for_symlink{false};  // replace the new socket file by a symlink
std::string g_symlink_target;
std::atomic<int> g_mode_at_bind{-1};  // the new file's mode the instant bind() returned

}  // namespace

extern "C" int __wrap_bind(int fd, const sockaddr* address, socklen_t length) {
  const int result = __real_bind(fd, address, length);
  const auto* un = reinterpret_cast<const sockaddr_un*>(address);
  if (result != 0 || address->sa_family != AF_UNIX || un->sun_path[0] == '\0') return result;
  struct stat st {};
  if (::lstat(un->sun_path, &st) == 0) g_mode_at_bind = static_cast<int>(st.st_mode & 07777);
  if (g_swap_for_symlink.exchange(false)) {
    ::unlink(un->sun_path);
    if (::symlink(g_symlink_target.c_str(), un->sun_path) != 0) std::abort();
  }
  return result;
}

namespace vmmipc::transport {
namespace {

const SipKey kSecret{0x5eed5eed12345678ULL, 0x0123456789abcdefULL};

uint32_t FakePid() {
  static std::atomic<uint32_t> counter{0};
  return 0x20000000u + (static_cast<uint32_t>(getpid()) << 6) + (counter++ & 63u);
}

ServeReply Refuse(const ServeRequest&) {
  ServeReply reply;
  reply.refuse = RefuseReason::kNotExported;
  return reply;
}

class TransportListenerPath : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/vmmipc-path-test-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
    victim_ = dir_ + "/victim";
    const int fd = ::open(victim_.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0);
    ::close(fd);
    ASSERT_EQ(::chmod(victim_.c_str(), 0644), 0);
    old_umask_ = ::umask(0);  // the widest: only the listener restricts the mode
  }
  void TearDown() override {
    ::umask(old_umask_);
    g_swap_for_symlink = false;
    ::unlink(victim_.c_str());
    ::rmdir(dir_.c_str());
  }
  ListenerOptions Options(uint32_t pid) {
    ListenerOptions o;
    o.secret = kSecret;
    o.pid = pid;
    o.socket_dir = dir_;
    o.timeout = Timeout::Ms(200);
    return o;
  }
  std::string PathOf(uint32_t pid) {
    return dir_ + "/" + SocketBaseName(geteuid(), SocketOwner::Pid(pid)) + ".sock";
  }
  int VictimMode() {
    struct stat st {};
    EXPECT_EQ(::lstat(victim_.c_str(), &st), 0);
    return static_cast<int>(st.st_mode & 07777);
  }

  std::string dir_;
  std::string victim_;
  mode_t old_umask_ = 0;
};

TEST_F(TransportListenerPath, SocketFileIsOwnerOnlyFromBirth) {
  const uint32_t pid = FakePid();
  g_mode_at_bind = -1;
  std::string error;
  auto listener = Listener::Start(Options(pid), Refuse, &error);
  ASSERT_NE(listener, nullptr) << error;
  // Not a moment with a wider mode (chmod after bind left one, at umask 0: 0777).
  EXPECT_EQ(g_mode_at_bind, 0600);
  struct stat st {};
  ASSERT_EQ(::lstat(PathOf(pid).c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  // The owner can still connect: the listener answers (here, a refusal).
  FetchRequest request;
  request.handle.exporter_pid = pid;
  request.handle.address = request.handle.chunk_base = 0x7f1200000000ULL;
  request.capability = wire::Capability(
      kSecret, {pid, 0, 0, request.handle.address, request.handle.chunk_base, 0, 0});
  FetchResult result = FetchChunks(request, ClientOptions{dir_, Timeout::Ms(1000)});
  EXPECT_EQ(result.status, FetchStatus::kRefused) << result.detail;
}

TEST_F(TransportListenerPath, SymlinkSwappedInAfterBindIsNotFollowed) {
  const uint32_t pid = FakePid();
  g_symlink_target = victim_;
  g_swap_for_symlink = true;
  std::string error;
  auto listener = Listener::Start(Options(pid), Refuse, &error);
  EXPECT_FALSE(g_swap_for_symlink) << "the wrapped bind() did not run";
  // Whatever Start made of it, the file the symlink points to is untouched.
  EXPECT_EQ(VictimMode(), 0644);
  listener.reset();
  // Stopping removes at most the link, never its target.
  EXPECT_EQ(VictimMode(), 0644);
  ::unlink(PathOf(pid).c_str());
}

TEST_F(TransportListenerPath, SymlinkPlantedBeforeStartIsRefusedAndNotFollowed) {
  const uint32_t pid = FakePid();
  ASSERT_EQ(::symlink(victim_.c_str(), PathOf(pid).c_str()), 0);
  std::string error;
  EXPECT_EQ(Listener::Start(Options(pid), Refuse, &error), nullptr);
  EXPECT_NE(error.find("exists and is not a socket"), std::string::npos) << error;
  EXPECT_EQ(VictimMode(), 0644);
  struct stat st {};
  ASSERT_EQ(::lstat(PathOf(pid).c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));  // left alone
  ::unlink(PathOf(pid).c_str());
}

}  // namespace
}  // namespace vmmipc::transport
