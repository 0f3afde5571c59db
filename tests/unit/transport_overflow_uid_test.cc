// Issue 36 item 2: the overflow uid (/proc/sys/kernel/overflowuid) is never
// "our uid". In a user namespace without a uid mapping (`unshare --user`) a
// process's euid is the overflow uid, and SO_PEERCRED reports every peer
// whose uid that namespace does not map (any other user) as the overflow uid
// too. Before, such an exporter served every user as its own (another uid's
// silent connections kept for the whole timeout, not the other-uid grace),
// and such an importer sent its request to another user's squatter. Now the
// exporter does not start its listener (one clear line), and the importer
// takes no listener of the overflow uid for its own. Staged in a forked
// child that unshares a user namespace and writes no map (no privilege
// needed where user namespaces are allowed; skipped where they are not).
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "listener_test_support.h"
#include "transport/client/fetch_client.h"
#include "transport/serve/listener/listener.h"
#include "transport/socket_address.h"
#include "transport/socket_uid.h"

namespace vmmipc::transport {
namespace {

using namespace listener_test;  // NOLINT(build/namespaces): the shared helpers

// The child's exit code when it cannot make the namespace.
constexpr int kNoNamespace = 77;

// In a forked child (one thread: unshare refuses a threaded process): a user
// namespace of its own without a uid map, so that its euid is the overflow uid.
bool EnterUnmappedUserNamespace() {
  return ::unshare(CLONE_NEWUSER) == 0 && ::geteuid() == OverflowUid();
}

TEST(OverflowUid, IsTheKernelsOrItsDefault) {
  EXPECT_EQ(ParseOverflowUid("65534\n"), 65534u);
  EXPECT_EQ(ParseOverflowUid("4242\n"), 4242u);
  EXPECT_EQ(ParseOverflowUid("nobody"), 65534u);
  EXPECT_EQ(ParseOverflowUid(""), 65534u);
  FILE* file = std::fopen("/proc/sys/kernel/overflowuid", "re");
  if (file == nullptr) GTEST_SKIP() << "no /proc/sys/kernel/overflowuid here";
  unsigned value = 0;
  EXPECT_EQ(std::fscanf(file, "%u", &value), 1);
  std::fclose(file);
  EXPECT_EQ(OverflowUid(), value);
}

TEST_F(TransportListener, AnExporterRunningAsTheOverflowUidDoesNotServe) {
  const int code = InChild([] {
    if (!EnterUnmappedUserNamespace()) return kNoNamespace;
    std::string error;
    auto listener = Listener::Start(Options(FakePid()), ChunksHandler(1), &error);
    if (listener != nullptr) return 10;  // it would serve every other user as itself
    std::printf("the listener's refusal: %s\n", error.c_str());
    return error.find("runs as the overflow uid") != std::string::npos ? 0 : 11;
  });
  if (code == kNoNamespace) GTEST_SKIP() << "cannot make an unmapped user namespace here";
  EXPECT_EQ(code, 0);
}

// The squatter is this process, listening under the name the child looks
// under (its uid, the overflow uid, has no mapping to name it by otherwise);
// to the child our uid, unmapped there, reads as the overflow uid: as its own,
// before. The child must not send it the request.
TEST_F(TransportListener, AnImporterNeverTakesAListenerOfTheOverflowUidForItsOwn) {
  constexpr uint32_t kInstance = 0x5e000001u;
  SocketAddress address;
  std::string error;
  ASSERT_TRUE(
      MakeSocketAddress(OverflowUid(), SocketOwner::Instance(kInstance), "", &address, &error))
      << error;
  ScopedFd squatter(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  ASSERT_EQ(::bind(squatter.get(), address.get(), address.length), 0) << strerror(errno);
  ASSERT_EQ(::listen(squatter.get(), 4), 0);
  const int code = InChild([] {
    if (!EnterUnmappedUserNamespace()) return kNoNamespace;
    FetchRequest request = Request(FakePid());
    request.exporter_instance = kInstance;
    const FetchResult result = FetchChunks(request, Client(1000));
    std::printf("the importer's refusal: %s\n", result.detail.c_str());
    if (result.status != FetchStatus::kUnauthentic) return 10 + static_cast<int>(result.status);
    return result.detail.find("overflow uid") != std::string::npos ? 0 : 9;
  });
  if (code == kNoNamespace) GTEST_SKIP() << "cannot make an unmapped user namespace here";
  EXPECT_EQ(code, 0);
  // What reached the squatter: a connection (made before the check), never a request.
  ScopedFd accepted(::accept4(squatter.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
  ASSERT_TRUE(accepted.valid()) << "the child did not connect";
  char byte = 0;
  EXPECT_LE(::recv(accepted.get(), &byte, 1, MSG_DONTWAIT), 0) << "the request reached it";
}

}  // namespace
}  // namespace vmmipc::transport
