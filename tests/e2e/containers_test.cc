// Containers on one host (issue 25): processes of one uid in pid namespaces
// of their own share one network namespace (Kubernetes hostNetwork, docker
// run --network host), and their small pids repeat from one to the next. An
// exporter's socket is named by its random instance id (handles of version
// 3), so two exporters of the same pid both export and an importer reaches
// each; a version 2 handle (an older vmmipc) still names its exporter's
// socket by pid.
//
// The pid namespaces are the test's own (PidNamespace: unshare, with a user
// namespace around it where the test may not make one otherwise; skipped
// where neither works). Each peer there gets a /proc of the namespace's own,
// without which the real driver's cuInit fails (docs/driver-behaviour.md#namespaces).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "e2e_layout.h"
#include "handle_hex.h"
#include "logged_peer_test.h"
#include "peer_process.h"
#include "state/handle_codec.h"

namespace vmmipc::testing {
namespace {

class Containers : public LoggedPeerTest {};

TEST_F(Containers, TwoExportersOfTheSamePidInTwoPidNamespacesBothExport) {
  std::string why;
  auto first_namespace = PidNamespace::Create(&why);
  if (first_namespace == nullptr) GTEST_SKIP() << "cannot make a pid namespace here: " << why;
  auto second_namespace = PidNamespace::Create(&why);
  ASSERT_NE(second_namespace, nullptr) << why;
  // The same pid in both, chosen (clone3's set_tid): which pid a namespace's
  // next process gets depends on what else started there (TSan's runtime,
  // the namespace's own probes).
  if (!first_namespace->ChoosesPids(&why) || !second_namespace->ChoosesPids(&why))
    GTEST_SKIP() << "cannot give both exporters one pid: " << why;
  constexpr pid_t kSharedPid = 77;
  auto first = Peer("exporter-a", "0", {}, {first_namespace.get(), kSharedPid});
  auto second = Peer("exporter-b", "1", {}, {second_namespace.get(), kSharedPid});
  auto importer = Peer("importer", "2");
  ASSERT_TRUE(first && second && importer);
  const std::string a = Handle(*first, VmmBuffer(*first, "a", 1, 61));
  const std::string b = Handle(*second, VmmBuffer(*second, "b", 1, 62));
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty()) << "the second exporter of that pid could not export";
  const state::Vmm2Handle ha = Decode(a), hb = Decode(b);
  EXPECT_EQ(ha.pid, static_cast<uint32_t>(kSharedPid));
  EXPECT_EQ(hb.pid, static_cast<uint32_t>(kSharedPid));
  EXPECT_EQ(ha.version, state::kHandleVersion);
  EXPECT_NE(ha.instance, hb.instance);
  OpenCheckClose(*importer, a, kChunk, 61);
  OpenCheckClose(*importer, b, kChunk, 62);
}

// A version 2 handle names its exporter's socket by pid, as an older vmmipc
// listens: this build reads it and looks there (where a version 3 exporter
// does not listen), and fails the open cleanly.
TEST_F(Containers, AVersionTwoHandleIsReadAndLooksForItsExporterByPid) {
  auto exporter = Peer("exporter", "0");
  auto importer = Peer("importer", "1");
  const std::string handle = Handle(*exporter, VmmBuffer(*exporter, "a", 1, 63));
  state::Vmm2Handle old = Decode(handle);
  old.version = 2;
  const std::string reply = importer->Call("open " + Encode(old));
  EXPECT_EQ(reply.rfind(ErrPrefix(CUDA_ERROR_INVALID_HANDLE), 0), 0u) << reply;
  EXPECT_TRUE(LogShows(*importer, "nobody listens on @vmmipc." + std::to_string(geteuid()) + "." +
                                      std::to_string(old.pid)))
      << Log(*importer);
  OpenCheckClose(*importer, handle, kChunk, 63);
}

// Separate network namespaces (containers without --network=host): abstract
// sockets do not cross them, so an importer in another one finds nobody
// under the exporter's name and its open fails cleanly with that line;
// VMMIPC_SOCKET_DIR on a directory both see is the way, and works.
TEST_F(Containers, AnImporterInAnotherNetworkNamespaceNeedsTheSocketDirectory) {
  std::string why;
  if (!CanMakeNetworkNamespace(&why)) GTEST_SKIP() << "cannot make a network namespace: " << why;
  PeerPlacement elsewhere;
  elsewhere.own_network_namespace = true;
  {
    auto exporter = Peer("exporter", "0");
    auto importer = Peer("importer", "1", {}, elsewhere);
    ASSERT_TRUE(exporter && importer);
    const std::string handle = Handle(*exporter, VmmBuffer(*exporter, "a", 1, 64));
    const Resources before = Held(*importer);
    const std::string reply = importer->Call("open " + handle);
    EXPECT_EQ(reply.rfind(ErrPrefix(CUDA_ERROR_INVALID_HANDLE), 0), 0u) << reply;
    EXPECT_TRUE(LogShows(*importer, "nobody listens on @vmmipc.")) << Log(*importer);
    EXPECT_EQ(Held(*importer), before);
  }
  char dir_template[] = "/tmp/vmmipc-netns-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::map<std::string, std::string> shared = {{"VMMIPC_SOCKET_DIR", dir_template}};
  {
    auto exporter = Peer("exporter-dir", "0", shared);
    auto importer = Peer("importer-dir", "1", shared, elsewhere);
    ASSERT_TRUE(exporter && importer);
    const std::string handle = Handle(*exporter, VmmBuffer(*exporter, "b", 1, 65));
    OpenCheckClose(*importer, handle, kChunk, 65);
  }
  std::filesystem::remove_all(dir_template);
}

}  // namespace
}  // namespace vmmipc::testing
