// The listener out of descriptors: accept() fails with EMFILE for as long as
// the process has none, and the pending connection stays queued, so the
// listener retries every 100 ms. Each failure used to log a line, ten a
// second without end (issue 26 item 2). This binary is linked with
// -Wl,--wrap=accept4 (tests/CMakeLists.txt), which only counts the calls and
// their failures, so that the test waits for a number of retries instead of
// a length of time; it is its own binary so that no other test's accept4()
// is wrapped.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "listener_test_support.h"

extern "C" int __real_accept4(int fd, sockaddr* address, socklen_t* length, int flags);

namespace {

std::atomic<int> g_accepted{0};
std::atomic<int> g_out_of_fds{0};  // accept4() calls that failed with EMFILE

}  // namespace

extern "C" int __wrap_accept4(int fd, sockaddr* address, socklen_t* length, int flags) {
  const int result = __real_accept4(fd, address, length, flags);
  if (result >= 0)
    ++g_accepted;
  else if (errno == EMFILE)
    ++g_out_of_fds;
  return result;
}

namespace vmmipc::transport {
namespace {

using namespace listener_test;  // NOLINT(build/namespaces): the shared helpers

size_t Occurrences(const std::string& text, const std::string& what) {
  size_t count = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++count;
  return count;
}

// Waits (1 ms steps, at most `ms`) until `done()`.
template <typename Done>
bool WaitFor(Done done, int ms) {
  const auto start = Clock::now();
  while (!done()) {
    if (ElapsedMs(start) > ms) return false;
    ::poll(nullptr, 0, 1);
  }
  return true;
}

TEST_F(TransportListener, AcceptFailingForLackOfFdsIsLoggedAFewTimesNotAtEveryRetry) {
  constexpr int kRetries = 15;  // 1.5 s of retries, 100 ms apart
  const std::string log_path =
      ::testing::TempDir() + "vmmipc-accept-" + std::to_string(getpid()) + ".log";
  const uint32_t pid = FakePid();
  const int code = InChild([&] {
    log::SetLevel(log::Level::kWarn);
    log::SetFile(log_path);
    VMMIPC_LOG_WARN("test: the log file is open before the fds run out");
    rlimit nofile{};
    if (getrlimit(RLIMIT_NOFILE, &nofile) != 0) return 10;
    nofile.rlim_cur = 64;
    if (setrlimit(RLIMIT_NOFILE, &nofile) != 0) return 11;
    auto listener = MustStart(Options(pid, 1000), ChunksHandler(1));
    if (listener == nullptr) return 12;
    // Made now, connected once the fds are gone: queued for a listener that
    // has no fd to take it with (connect() needs no new fd on this side).
    const SocketAddress address = AbstractAddress(pid);
    ScopedFd pending(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    if (!pending.valid()) return 13;
    std::vector<ScopedFd> fillers;
    for (int fd; (fd = ::fcntl(0, F_DUPFD_CLOEXEC, 0)) >= 0;) fillers.emplace_back(fd);
    if (::connect(pending.get(), address.get(), address.length) != 0) return 17;
    if (!WaitFor([] { return g_out_of_fds >= kRetries; }, 10000)) return 14;
    fillers.clear();
    // With fds again, the pending connection is taken and our uid is served.
    if (!WaitFor([] { return g_accepted >= 1; }, 5000)) return 15;
    if (FetchChunks(Request(pid), Client(2000)).status != FetchStatus::kOk) return 16;
    return 0;
  });
  EXPECT_EQ(code, 0);
  std::ifstream in(log_path);
  std::stringstream text;
  text << in.rdbuf();
  const size_t lines = Occurrences(text.str(), "accept failed");
  EXPECT_GE(lines, 1u) << text.str();
  // The first 3 of each minute; the rest are counted into one line after it.
  EXPECT_LE(lines, 3u) << kRetries << " failed retries logged as:\n" << text.str();
  std::printf("%d retries of accept() out of fds: %zu log lines\n", kRetries, lines);
  std::filesystem::remove(log_path);
}

}  // namespace
}  // namespace vmmipc::transport
