// A forked child abandons its parent's process state (core/process_state.cc:
// the parent's locks and listener thread are not its own) and must still exit
// cleanly: under LeakSanitizer the abandoned state has to stay reachable
// (common/parked.h), or every forked child of a vmmipc process that exits
// normally fails with a leak report.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <vector>

#include "core/process_state.h"

namespace vmmipc::core {
namespace {

// Creates the state with heap memory of its own, as an importer's: an open
// record. Only the instance id comes back: no pointer to the parent's state may stay
// on the test's stack, or LeakSanitizer would see the state through it.
[[gnu::noinline]] uint64_t StateWithAnImport() {
  ProcessState& state = State();
  ledger::OpenRecord record;
  record.pointer = 0x7f0000000000;
  record.key.exporter = {1234, 0x5eed};
  record.opens = 1;
  std::vector<ledger::MappedChunk> chunks;
  for (uint64_t i = 0; i < 3; ++i) {
    const uint64_t target = 0x7f0000000000 + i * 0x200000;
    chunks.push_back({target, 0x200000, record.key.exporter, 0x10000000 + i * 0x200000, 1, 0});
    record.chunks.push_back(target);
  }
  state.importer.AddOpen(chunks, record);
  return state.identity.instance;
}

TEST(CoreForkState, ForkedChildExitsCleanlyAfterAbandoningTheParentsState) {
  const uint64_t parent_instance = StateWithAnImport();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::exit(State().identity.instance != parent_instance ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}

}  // namespace
}  // namespace vmmipc::core
