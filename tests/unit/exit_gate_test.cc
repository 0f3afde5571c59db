// The exit gate (common/exit_gate.h) and its use by core's driver door
// (core/real.h): the close waits for passes in progress (a hold point: the
// test holds the pass, never a sleep), grants none after, but for a pass
// inside one of the same thread's; its wait has a bound; the closing
// thread's own pass is not waited for; a forked child starts with none in
// progress and its gate open; only vmmipc's threads are gated, and a gated
// driver call after the close is never made and answers
// CUDA_ERROR_DEINITIALIZED.
#include "common/exit_gate.h"

#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/quiet_thread.h"
#include "core/real.h"
#include "thread_watch.h"

namespace vmmipc {
namespace {

using ::vmmipc::testing::Eventually;
using ::vmmipc::testing::Sleeps;

using std::chrono::milliseconds;

// A thread that holds a pass until told to let it go (the hold point), and
// can take a second one inside it on request.
class PassHolder {
 public:
  PassHolder() {
    thread_ = std::thread([this] {
      ExitGatePass pass;
      std::unique_lock<std::mutex> lock(mutex_);
      open_ = pass.open();
      changed_.notify_all();
      changed_.wait(lock, [this] { return release_ || nest_; });
      if (nest_) {
        ExitGatePass inner;
        inner_open_ = inner.open();
        changed_.notify_all();
        changed_.wait(lock, [this] { return release_; });
      }
    });
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return open_.has_value(); });
  }
  ~PassHolder() {
    Release();
    thread_.join();
  }
  bool open() {
    std::lock_guard<std::mutex> lock(mutex_);
    return open_.value_or(false);
  }
  // The holder takes a second pass inside its first; its open().
  bool Nest() {
    std::unique_lock<std::mutex> lock(mutex_);
    nest_ = true;
    changed_.notify_all();
    changed_.wait(lock, [this] { return inner_open_.has_value(); });
    return *inner_open_;
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mutex_);
    release_ = true;
    changed_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::optional<bool> open_, inner_open_;
  bool nest_ = false, release_ = false;
  std::thread thread_;
};

// Closes the gate on a thread of its own; seen blocked or done.
class Closer {
 public:
  explicit Closer(milliseconds bound = kExitBound) {
    thread_ = std::thread([this, bound] {
      tid_ = static_cast<pid_t>(syscall(SYS_gettid));
      const auto t0 = std::chrono::steady_clock::now();
      none_left_ = CloseExitGate(bound);
      took_ = std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0);
      done_ = true;
    });
  }
  ~Closer() {
    if (thread_.joinable()) thread_.join();
  }
  // Blocked in the close (asleep and not done), once it has begun.
  bool Blocked() {
    return Eventually([&] { return tid_ != 0; }) &&
           Eventually([&] { return Sleeps(tid_) || done_; }) && !done_;
  }
  bool Done() {
    return Eventually([&] { return done_.load(); });
  }
  bool none_left() const { return none_left_; }
  milliseconds took() const { return took_; }

 private:
  std::atomic<pid_t> tid_{0};
  std::atomic<bool> done_{false};
  bool none_left_ = false;
  milliseconds took_{0};
  std::thread thread_;
};

class ExitGateTest : public ::testing::Test {
 protected:
  void TearDown() override { ReopenExitGateForTests(); }
};

TEST_F(ExitGateTest, TheCloseWaitsForAPassInProgressAndGrantsNoneAfter) {
  PassHolder holder;
  ASSERT_TRUE(holder.open());
  EXPECT_FALSE(ExitGateClosed());
  Closer closer;
  EXPECT_TRUE(closer.Blocked()) << "the close did not wait for the pass";
  EXPECT_TRUE(ExitGateClosed());
  {
    ExitGatePass late;
    EXPECT_FALSE(late.open()) << "a pass was granted after the close";
  }
  EXPECT_TRUE(closer.Blocked()) << "a refused pass let the close go";
  holder.Release();
  ASSERT_TRUE(closer.Done());
  EXPECT_TRUE(closer.none_left());
}

// Work in progress runs to its end: its second pass is granted after the close.
TEST_F(ExitGateTest, APassInsideOneOfTheSameThreadsIsGrantedAfterTheClose) {
  PassHolder holder;
  Closer closer;
  ASSERT_TRUE(closer.Blocked());
  EXPECT_TRUE(holder.Nest()) << "the work in progress could not finish";
  EXPECT_TRUE(closer.Blocked());
  holder.Release();
  ASSERT_TRUE(closer.Done());
  EXPECT_TRUE(closer.none_left());
}

// One bound for the whole exit: a pass that does not end is waited for no
// longer, and said (false).
TEST_F(ExitGateTest, TheCloseWaitsNoLongerThanItsBound) {
  PassHolder holder;
  Closer closer(milliseconds(100));
  ASSERT_TRUE(closer.Done());
  EXPECT_FALSE(closer.none_left());
  EXPECT_GE(closer.took(), milliseconds(100));
  EXPECT_LT(closer.took(), milliseconds(5000));
}

// An exit from inside a pass (a handler that exits on the thread that
// holds one) does not wait for itself, only for the others' passes: the
// end of another thread's pass lets it go at once, not at its bound.
TEST_F(ExitGateTest, TheClosingThreadsOwnPassIsNotWaitedFor) {
  {
    ExitGatePass mine;
    ASSERT_TRUE(mine.open());
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_TRUE(CloseExitGate(milliseconds(3000)));
    EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(1000));
  }
  ReopenExitGateForTests();
  PassHolder other;
  std::atomic<bool> closing{false};
  bool none_left = false;
  auto took = milliseconds(0);
  std::thread closer([&] {
    ExitGatePass mine;
    closing = true;
    const auto t0 = std::chrono::steady_clock::now();
    none_left = CloseExitGate(milliseconds(5000));
    took = std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0);
  });
  ASSERT_TRUE(Eventually([&] { return closing && ExitGateClosed(); }));
  other.Release();
  closer.join();
  EXPECT_TRUE(none_left);
  EXPECT_LT(took, milliseconds(2500)) << "the close waited for its own pass until its bound";
}

// A child forked while another thread holds a pass has no such thread: its
// close waits for nothing, and its gate is open even when the parent's is
// closed.
TEST_F(ExitGateTest, AForkedChildHasNoPassInProgressAndAnOpenGate) {
  // The fork handler is registered with the first of vmmipc's threads.
  StartQuietThread("vmmipc-test", [] {})->join();
  PassHolder holder;
  Closer closer;
  ASSERT_TRUE(closer.Blocked());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int code = 0;
    if (ExitGateClosed()) code |= 1;
    {
      ExitGatePass pass;
      if (!pass.open()) code |= 2;
    }
    if (!CloseExitGate(milliseconds(0))) code |= 4;
    _exit(code);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status) & 1, 0) << "the child's gate was closed";
  EXPECT_EQ(WEXITSTATUS(status) & 2, 0) << "the child was refused a pass";
  EXPECT_EQ(WEXITSTATUS(status) & 4, 0) << "the child waited for its parent's pass";
  holder.Release();
  ASSERT_TRUE(closer.Done());
}

TEST_F(ExitGateTest, OnlyVmmipcsThreadsAreMarked) {
  EXPECT_FALSE(OnVmmipcThread());
  std::atomic<bool> marked{false};
  StartQuietThread("vmmipc-test", [&] { marked = OnVmmipcThread(); })->join();
  EXPECT_TRUE(marked);
  bool plain = true;
  std::thread([&] { plain = OnVmmipcThread(); }).join();
  EXPECT_FALSE(plain);
}

// core's door to the driver: after the close, a call of vmmipc's thread is
// never made and answers CUDA_ERROR_DEINITIALIZED (no warning: RefusedAtExit);
// before it, the call is made.
TEST_F(ExitGateTest, AGatedDriverCallAfterTheCloseIsNeverMade) {
  std::atomic<int> made{0};
  const auto call = [&] {
    ++made;
    return CUDA_SUCCESS;
  };
  CUresult before = CUDA_ERROR_UNKNOWN, after = CUDA_ERROR_UNKNOWN;
  bool refused = false;
  StartQuietThread("vmmipc-test", [&] { before = core::PastExitGate(call); })->join();
  ASSERT_TRUE(CloseExitGate(milliseconds(1000)));
  StartQuietThread("vmmipc-test", [&] {
    after = core::PastExitGate(call);
    refused = core::RefusedAtExit(after);
  })->join();
  EXPECT_EQ(before, CUDA_SUCCESS);
  EXPECT_EQ(after, CUDA_ERROR_DEINITIALIZED);
  EXPECT_EQ(made, 1) << "a call was made after the close";
  EXPECT_TRUE(refused);
  EXPECT_FALSE(core::RefusedAtExit(after)) << "the application's thread is not gated";
}

}  // namespace
}  // namespace vmmipc
