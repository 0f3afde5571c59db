// Containers on one host (issue 25): processes of one uid in pid namespaces
// of their own share one network namespace (Kubernetes hostNetwork, docker
// run --network host), and their small pids repeat from one to the next. An
// exporter's socket is named by its random instance id (handles of version
// 3), so two exporters of the same pid both export and an importer reaches
// each; a version 2 handle (an older vmmipc) still names its exporter's
// socket by pid. A rootless container's process (a user namespace of its
// own) shares with the host's processes of its user, and exporters of one
// pid colliding on one rank slot are told apart.
//
// The pid namespaces are the test's own (PidNamespace: unshare, with a user
// namespace around it where the test may not make one otherwise; skipped
// where neither works). Each peer there gets a /proc of the namespace's own,
// without which the real driver's cuInit fails (docs/driver-behaviour.md#namespaces).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "e2e_layout.h"
#include "handle_hex.h"
#include "ledger/handle_codec.h"
#include "logged_peer_test.h"
#include "peer_process.h"

namespace vmmipc::testing {
namespace {

class Containers : public LoggedPeerTest {};

// The uid a rootless container's process has inside it: 0 (`unshare --user
// --map-root-user`), or 1000 where the test runs as root, so that the uid it
// sees of itself always differs from the one the host sees.
int UidInside() { return geteuid() == 0 ? 1000 : 0; }

std::string Hex8(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof(text), "%08llx", static_cast<unsigned long long>(value));
  return text;
}

// Two pid namespaces of the test's, in each of which a peer can be given
// one chosen pid (clone3's set_tid): which pid a namespace's next process
// gets depends on what else started there (TSan's runtime, the namespace's
// own probes). Empty, with the reason, where either cannot be had.
struct TwoPidNamespaces {
  std::unique_ptr<PidNamespace> first, second;
  std::string why_not;
};
TwoPidNamespaces MakeTwoPidNamespaces() {
  TwoPidNamespaces made;
  std::string why;
  made.first = PidNamespace::Create(&why);
  if (made.first) made.second = PidNamespace::Create(&why);
  if (!made.first || !made.second) {
    made.why_not = "cannot make a pid namespace here: " + why;
  } else if (!made.first->ChoosesPids(&why) || !made.second->ChoosesPids(&why)) {
    made.why_not = "cannot give both exporters one pid: " + why;
  }
  return made;
}

TEST_F(Containers, TwoExportersOfTheSamePidInTwoPidNamespacesBothExport) {
  const TwoPidNamespaces namespaces = MakeTwoPidNamespaces();
  if (!namespaces.why_not.empty()) GTEST_SKIP() << namespaces.why_not;
  constexpr pid_t kSharedPid = 77;
  auto first = Peer("exporter-a", "0", {}, {namespaces.first.get(), kSharedPid});
  auto second = Peer("exporter-b", "1", {}, {namespaces.second.get(), kSharedPid});
  auto importer = Peer("importer", "2");
  ASSERT_TRUE(first && second && importer);
  const std::string a = Handle(*first, VmmBuffer(*first, "a", 1, 61));
  const std::string b = Handle(*second, VmmBuffer(*second, "b", 1, 62));
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty()) << "the second exporter of that pid could not export";
  const ledger::Vmm2Handle ha = Decode(a), hb = Decode(b);
  EXPECT_EQ(ha.pid, static_cast<uint32_t>(kSharedPid));
  EXPECT_EQ(hb.pid, static_cast<uint32_t>(kSharedPid));
  EXPECT_EQ(ha.version, ledger::kHandleVersion);
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
  ledger::Vmm2Handle old = Decode(handle);
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

// Two containers' exporters of one pid that both take rank slot 0 (each
// thinks it is rank 0): the importer places the second best-effort, and its
// one warning names both by pid and instance, since the pids alone read the same.
TEST_F(Containers, TwoExportersOfOnePidOnOneRankSlotAreToldApartByInstance) {
  const TwoPidNamespaces namespaces = MakeTwoPidNamespaces();
  if (!namespaces.why_not.empty()) GTEST_SKIP() << namespaces.why_not;
  constexpr pid_t kSharedPid = 78;
  auto first = Peer("exporter-a", "0", {}, {namespaces.first.get(), kSharedPid});
  auto second = Peer("exporter-b", "0", {}, {namespaces.second.get(), kSharedPid});
  auto importer = Peer("importer", "1");
  ASSERT_TRUE(first && second && importer);
  const std::string a = Handle(*first, VmmBuffer(*first, "a", 1, 66));
  const std::string b = Handle(*second, VmmBuffer(*second, "b", 1, 67));
  const std::string pa = Value(importer->Call("open " + a));
  const std::string pb = Value(importer->Call("open " + b));
  ASSERT_FALSE(pa.empty() || pb.empty());
  EXPECT_EQ(importer->Call("check " + pb + " " + Hex(kChunk) + " 67"), "ok");
  const std::string expected = "rank slot 0 already serves pid 78 (instance " +
                               Hex8(Decode(a).instance) + "), and pid 78 (instance " +
                               Hex8(Decode(b).instance) + ") claims it too";
  EXPECT_TRUE(LogShows(*importer, expected)) << Log(*importer);
  EXPECT_EQ(importer->Call("close " + pa), "ok");
  EXPECT_EQ(importer->Call("close " + pb), "ok");
}

// Rootless containers (podman, docker rootless): a user namespace in which
// the user's uid reads as 0. "The same uid" is the same uid of the host: the
// socket is named by the uid the parent namespace sees, and SO_PEERCRED maps
// the peer's uid into the receiver's namespace. Without that naming the
// container's exporter would listen as @vmmipc.0.* and the host's importer
// look for @vmmipc.<uid>.* (or, as root here, 1000 against 0). Both ways.
TEST_F(Containers, ARootlessContainersProcessSharesWithTheHostsProcessesOfItsUser) {
  std::string why;
  if (!CanMakeUserNamespace(&why)) GTEST_SKIP() << "cannot make a user namespace: " << why;
  PeerPlacement rootless;
  rootless.user_namespace_uid = UidInside();
  auto host = Peer("host", "0");
  auto contained = Peer("rootless", "1", {}, rootless);
  ASSERT_TRUE(host && contained);
  ASSERT_EQ(contained->Call("uid"), "ok " + std::to_string(UidInside()));
  OpenCheckClose(*host, Handle(*contained, VmmBuffer(*contained, "a", 1, 71)), kChunk, 71);
  OpenCheckClose(*contained, Handle(*host, VmmBuffer(*host, "b", 1, 72)), kChunk, 72);
}

// Rootless podman's default: its own network namespace as well (slirp4netns,
// pasta), so abstract names do not reach the host; a directory both mount
// does. The directory is the host user's (0700), which the container's
// process sees as its own (stat maps the owner too).
TEST_F(Containers, ARootlessContainerWithItsOwnNetworkSharesThroughTheSocketDirectory) {
  std::string why;
  if (!CanMakeUserNamespace(&why)) GTEST_SKIP() << "cannot make a user namespace: " << why;
  PeerPlacement rootless;
  rootless.user_namespace_uid = UidInside();
  rootless.own_network_namespace = true;
  char dir_template[] = "/tmp/vmmipc-rootless-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::map<std::string, std::string> shared = {{"VMMIPC_SOCKET_DIR", dir_template}};
  {
    auto host = Peer("host", "0", shared);
    auto contained = Peer("rootless", "1", shared, rootless);
    ASSERT_TRUE(host && contained);
    OpenCheckClose(*host, Handle(*contained, VmmBuffer(*contained, "a", 1, 73)), kChunk, 73);
    OpenCheckClose(*contained, Handle(*host, VmmBuffer(*host, "b", 1, 74)), kChunk, 74);
  }
  std::filesystem::remove_all(dir_template);
}

// Issue 36 item 2: a user namespace without a uid map (`unshare --user`).
// Its process is the overflow uid, and so, to it, is every other user's
// process: before, its exporter served every user as its own (another uid's
// silent connections kept for the whole timeout). Now it does not serve:
// its get of VMM memory fails with one clear line; a process of the host
// then finds nothing to open (and the exporter's own memory still works).
TEST_F(Containers, AnExporterInAnUnmappedUserNamespaceRefusesToServeInOneClearLine) {
  std::string why;
  if (!CanMakeUserNamespace(&why)) GTEST_SKIP() << "cannot make a user namespace: " << why;
  PeerPlacement unmapped;
  unmapped.unmapped_user_namespace = true;
  auto contained = Peer("unmapped", "0", {}, unmapped);
  ASSERT_NE(contained, nullptr);
  std::ifstream overflow_file("/proc/sys/kernel/overflowuid");
  int overflow = 65534;
  overflow_file >> overflow;
  ASSERT_EQ(contained->Call("uid"), "ok " + std::to_string(overflow));
  const uint64_t base = VmmBuffer(*contained, "a", 1, 75);
  const std::string got = contained->Call("get " + Hex(base));
  EXPECT_FALSE(StartsWith(got, "ok ")) << "it exports as the overflow uid: " << got;
  EXPECT_TRUE(LogShows(*contained, "runs as the overflow uid " + std::to_string(overflow)))
      << Log(*contained);
  EXPECT_EQ(contained->Call("check " + Hex(base) + " " + Hex(kChunk) + " 75"), "ok");
}

// An importer in a user namespace whose exporter is gone: the open fails
// cleanly, and its one line names the uid it looked under and why that is
// not the uid it sees of itself, beside the other reasons nobody may listen.
TEST_F(Containers, ARootlessImportersFailedOpenSaysWhichUidItLookedUnder) {
  std::string why;
  if (!CanMakeUserNamespace(&why)) GTEST_SKIP() << "cannot make a user namespace: " << why;
  PeerPlacement rootless;
  rootless.user_namespace_uid = UidInside();
  // Follow off: the count below is the failed open's alone (with follow the
  // importer's watch connection to the killed exporter closes meanwhile).
  const std::map<std::string, std::string> legacy = {{"VMMIPC_FOLLOW", "0"}};
  auto exporter = Peer("exporter", "0", legacy);
  auto contained = Peer("rootless", "1", legacy, rootless);
  ASSERT_TRUE(exporter && contained);
  const std::string handle = Handle(*exporter, VmmBuffer(*exporter, "a", 1, 75));
  OpenCheckClose(*contained, handle, kChunk, 75);
  exporter->Kill();
  const Resources before = Held(*contained);
  const std::string reply = contained->Call("open " + handle);
  EXPECT_EQ(reply.rfind(ErrPrefix(CUDA_ERROR_INVALID_HANDLE), 0), 0u) << reply;
  const std::string host_uid = std::to_string(geteuid());
  EXPECT_TRUE(LogShows(*contained, "nobody listens on @vmmipc." + host_uid + ".i"))
      << Log(*contained);
  EXPECT_TRUE(LogShows(*contained, "(this process is uid " + std::to_string(UidInside()) +
                                       " in a user namespace, uid " + host_uid + " outside it)"))
      << Log(*contained);
  EXPECT_EQ(Settled(*contained, before), before);
}

// One open of a buffer of `exporter`'s in `importer`, as a row's cell: "ok"
// when the pattern reads back, else the open's (or the check's) answer.
std::string OpenResult(PeerProcess& importer, const std::string& handle, int seed) {
  const std::string reply = importer.Call("open " + handle);
  const std::string ptr = Value(reply);
  if (ptr.empty()) return reply.empty() ? "no answer" : reply;
  const std::string checked =
      importer.Call("check " + ptr + " " + Hex(kChunk) + " " + std::to_string(seed));
  importer.Call("close " + ptr);
  return checked == "ok" ? "ok" : "opened, but " + checked;
}

// A container layout of the table below: where its importer runs, or why
// that cannot be made here.
struct Layout {
  std::string name;
  PeerPlacement placement;
  std::string skip;  // why the layout cannot be made here; empty when it can
};

// The layouts a container runtime makes, the importer's pid namespace being
// `pid_namespace` (null: none could be made, `no_pid_namespace` says why).
std::vector<Layout> ContainerLayouts(const PidNamespace* pid_namespace,
                                     const std::string& no_pid_namespace) {
  std::string why;
  const std::string no_user_namespace =
      CanMakeUserNamespace(&why) ? "" : "no user namespace: " + why;
  const std::string no_network_namespace =
      CanMakeNetworkNamespace(&why) ? "" : "no network namespace: " + why;
  const std::string not_root = geteuid() == 0 ? "" : "not root: cannot start a peer as another uid";
  std::vector<Layout> layouts(7);
  layouts[0].name = "same namespaces";
  layouts[1].name = "own pid namespace (+ mount, /proc)";
  layouts[1].placement.pid_namespace = pid_namespace;
  layouts[1].skip = no_pid_namespace;
  layouts[2].name = "own network namespace";
  layouts[2].placement.own_network_namespace = true;
  layouts[2].skip = no_network_namespace;
  layouts[3].name = "own IPC namespace";
  layouts[3].placement.own_ipc_namespace = true;
  // Without root an IPC namespace needs a user namespace around it.
  if (geteuid() != 0) layouts[3].placement.user_namespace_uid = static_cast<int>(geteuid());
  layouts[3].skip = geteuid() == 0 ? "" : no_user_namespace;
  layouts[4].name = "own user namespace (rootless)";
  layouts[4].placement.user_namespace_uid = UidInside();
  layouts[4].skip = no_user_namespace;
  layouts[5].name = "own user + network namespaces (rootless podman)";
  layouts[5].placement.user_namespace_uid = UidInside();
  layouts[5].placement.own_network_namespace = true;
  layouts[5].skip = no_user_namespace.empty() ? no_network_namespace : no_user_namespace;
  layouts[6].name = "another uid (65534)";
  layouts[6].placement.uid = 65534;
  layouts[6].skip = not_root;
  return layouts;
}

// What legacy CUDA IPC itself needs across containers, beside vmmipc, in one
// run: an exporter where the test runs, an importer in each layout a
// container runtime makes (its own pid namespace with its /proc, network
// namespace, IPC namespace, user namespace, a rootless podman's user and
// network namespaces, another uid). Each layout opens a cuMemAlloc buffer
// through legacy IPC and a VMM buffer through vmmipc; vmmipc is given what
// its docs say to set there (VMMIPC_SOCKET_DIR where the network namespace
// differs). The table is printed; the rule checked is the issue's: on the
// real driver vmmipc opens wherever legacy IPC does, but for another uid,
// which vmmipc does not serve by design (docs/security.md), with its one line.
TEST_F(Containers, LegacyIpcAndVmmipcInEachContainerLayout) {
  std::string why;
  auto pid_namespace = PidNamespace::Create(&why);
  const std::vector<Layout> layouts =
      ContainerLayouts(pid_namespace.get(), pid_namespace ? "" : "no pid namespace: " + why);
  char dir_template[] = "/tmp/vmmipc-layouts-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  std::string table = "\nlayout | legacy CUDA IPC | vmmipc\n--- | --- | ---\n";
  int seed = 80;
  for (const Layout& layout : layouts) {
    if (!layout.skip.empty()) {
      table += layout.name + " | skipped: " + layout.skip + " | skipped\n";
      continue;
    }
    std::map<std::string, std::string> env;
    if (layout.placement.own_network_namespace) env["VMMIPC_SOCKET_DIR"] = dir_template;
    auto exporter = Peer("exporter", "0", env);
    auto importer = Peer("importer", "1", env, layout.placement);
    ASSERT_TRUE(exporter && importer) << layout.name;
    const uint64_t legacy = Num(Value(exporter->Call("alloc_legacy " + Hex(kChunk))));
    ASSERT_NE(legacy, 0u) << layout.name;
    ASSERT_EQ(
        exporter->Call("fill " + Hex(legacy) + " " + Hex(kChunk) + " " + std::to_string(seed)),
        "ok");
    const std::string legacy_result = OpenResult(*importer, Handle(*exporter, legacy), seed);
    ++seed;
    const std::string vmm_result =
        OpenResult(*importer, Handle(*exporter, VmmBuffer(*exporter, "v", 1, seed)), seed);
    ++seed;
    table += layout.name + " | " + legacy_result + " | " + vmm_result + "\n";
    if (layout.placement.uid >= 0) {
      // Its socket name carries its uid, so it looks where nobody listens.
      EXPECT_NE(vmm_result, "ok") << "another uid's importer was served";
      EXPECT_TRUE(LogShows(
          *importer, "nobody listens on @vmmipc." + std::to_string(layout.placement.uid) + ".i"))
          << Log(*importer);
      EXPECT_TRUE(LogShows(*importer,
                           "or runs as another uid than " + std::to_string(layout.placement.uid)))
          << Log(*importer);
    } else if (!Sim() && legacy_result == "ok") {
      EXPECT_EQ(vmm_result, "ok") << layout.name << ": legacy IPC opens there, vmmipc does not";
    } else if (Sim()) {
      EXPECT_EQ(vmm_result, "ok") << layout.name;
    }
    EXPECT_EQ(exporter->Call("free_legacy " + Hex(legacy)), "ok");
  }
  std::filesystem::remove_all(dir_template);
  std::printf("%s driver:%s", Sim() ? "simulated" : "real", table.c_str());
  RecordProperty("layouts", table);
}

}  // namespace
}  // namespace vmmipc::testing
