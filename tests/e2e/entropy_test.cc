// A process without randomness from the kernel (a seccomp policy refusing
// getrandom, no /dev/urandom: the vmmipc_no_entropy double preloaded ahead of
// vmmipc) has no handle secret: a secret made from the clock and pid could be
// guessed, and with it every handle's capability. Its exports are refused with
// CUDA_ERROR_OPERATING_SYSTEM and one log line that says why; opening other
// processes' handles works (an importer needs no secret; its request nonce and
// instance id need only be unique). docs/security.md, "Randomness".
#include <cuda.h>
#include <gtest/gtest.h>

#include <string>

#include "e2e_layout.h"
#include "logged_peer_test.h"
#include "peer_process.h"

namespace vmmipc::testing {
namespace {

constexpr char kRefused[] =
    "no randomness for this process's handle secret (getrandom: Operation not permitted; "
    "/dev/urandom: No such file or directory)";

class NoEntropy : public LoggedPeerTest {
 protected:
  std::unique_ptr<PeerProcess> Sandboxed(const std::string& name, const std::string& rank) {
    return Peer(name, rank,
                {{"LD_PRELOAD", std::string(VMMIPC_NO_ENTROPY_PATH) + ":" + VMMIPC_LIBRARY_PATH}});
  }
};

TEST_F(NoEntropy, ExportsAreRefusedWithOneLineThatSaysWhy) {
  auto exporter = Sandboxed("exporter", "0");
  ASSERT_NE(exporter, nullptr);
  const uint64_t base = VmmBuffer(*exporter, "a", 2, 3);
  EXPECT_TRUE(
      StartsWith(exporter->Call("get " + Hex(base)), ErrPrefix(CUDA_ERROR_OPERATING_SYSTEM)));
  EXPECT_TRUE(StartsWith(exporter->Call("get " + Hex(base + kChunk)),
                         ErrPrefix(CUDA_ERROR_OPERATING_SYSTEM)));
  const std::string log = Log(*exporter);
  const size_t first = log.find(kRefused);
  EXPECT_NE(first, std::string::npos) << log;
  EXPECT_EQ(log.find(kRefused, first + 1), std::string::npos) << "said more than once:\n" << log;
}

TEST_F(NoEntropy, ImportsStillWork) {
  auto exporter = Peer("exporter", "0");
  auto importer = Sandboxed("importer", "1");
  ASSERT_NE(exporter, nullptr);
  ASSERT_NE(importer, nullptr);
  const std::string handle = Handle(*exporter, VmmBuffer(*exporter, "a", 2, 4));
  OpenCheckClose(*importer, handle, 2 * kChunk, 4);
  OpenCheckClose(*importer, handle, 2 * kChunk, 4);  // a second exchange, a second nonce
}

}  // namespace
}  // namespace vmmipc::testing
