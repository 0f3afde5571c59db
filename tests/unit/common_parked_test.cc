// Park keeps deliberately leaked objects reachable, so that LeakSanitizer does
// not fail a process, or a forked child, that abandoned them on purpose (the
// parent's logger in a child: common/log.cc ResetAfterFork). Under
// AddressSanitizer these fail without Park; elsewhere they document the rule.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "common/log.h"
#include "common/parked.h"

namespace vmmipc {
namespace {

TEST(CommonParked, ParkedObjectIsNotReportedAtExit) {
  // LeakSanitizer checks at this test process's exit: the string must be reachable.
  Park(new std::string(200, 'p'));
  Park(nullptr);
  SUCCEED();
}

TEST(CommonParked, ForkedChildThatAbandonsTheLoggerExitsCleanly) {
  log::Write(log::Level::kDebug, "creating the logger before the fork");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    log::ResetAfterFork();  // what the fork handler does in every child
    log::Write(log::Level::kDebug, "a fresh logger in the child");
    std::exit(0);  // LeakSanitizer runs here
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}

}  // namespace
}  // namespace vmmipc
