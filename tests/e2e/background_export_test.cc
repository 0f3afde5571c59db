// The background export (issue 46; VMMIPC_BACKGROUND_EXPORT=1): each chunk
// a process maps is exported by a thread of vmmipc's before any get, so the
// get is a lookup. What must hold: the thread starts with the first VMM map
// and never in a process that maps none (nor with the setting off), and what
// it keeps at rest is one fd per mapped chunk; a chunk freed before it is
// shared keeps no fd, also when the free comes during its export; nothing is
// exported while the process maps or unmaps, opens a handle or its listener
// serves a request (each held open by the test: a delayed map or unmap, a
// stopped exporter, a delayed export); an exit during an export waits for it;
// past its share of the fd cache it leaves chunks to their get, which
// exports them as before; a fork during an export leaves the child none of
// its fds, and the parent goes on.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include "e2e_layout.h"
#include "logged_peer_test.h"
#include "peer_process.h"

namespace vmmipc::testing {
namespace {

// The names of the threads of `pid`, for a failure's message.
std::string ThreadNames(pid_t pid) {
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  std::string names;
  DIR* d = opendir(tasks.c_str());
  if (d == nullptr) return names;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream in(tasks + "/" + e->d_name + "/comm");
    std::string comm;
    std::getline(in, comm);
    names += comm + " ";
  }
  closedir(d);
  return names;
}

// The threads of `pid`, or how many of them have a name that starts with `name`.
int ThreadsOf(pid_t pid, const std::string& name = "") {
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = opendir(tasks.c_str());
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    if (name.empty()) {
      ++n;
      continue;
    }
    std::ifstream in(tasks + "/" + e->d_name + "/comm");
    std::string comm;
    std::getline(in, comm);
    n += comm.rfind(name, 0) == 0;  // a name, or the start of one
  }
  closedir(d);
  return n;
}

class BackgroundExport : public LoggedPeerTest {
 protected:
  // A peer with the background export on, its debug lines and its counters.
  std::unique_ptr<PeerProcess> ExportingPeer(const std::string& name, const std::string& rank,
                                             std::map<std::string, std::string> env = {}) {
    env.emplace("VMMIPC_BACKGROUND_EXPORT", "1");
    env.emplace("VMMIPC_LOG_LEVEL", "debug");
    env.emplace("VMMIPC_STATS", "1");
    return Peer(name, rank, env);
  }

  bool Exported(PeerProcess& p, uint64_t base, int ms = 5000) {
    return LogShows(p, "background export: exported " + Hex(base), ms);
  }

  // The fds one mapping adds by itself (the simulator backs memory with a
  // memfd; the driver does not), seen in a process without the export.
  int FdsPerMap() {
    auto plain = Peer("plain", "3");
    const int fresh = SteadyFdsOf(plain->pid());
    (void)VmmBuffer(*plain, "m", 1, 9);
    return SteadyFdsOf(plain->pid()) - fresh;
  }

  // A first chunk mapped and exported in the background: the thread runs
  // and the export keep-alive exists; the fds then.
  int Warm(PeerProcess& p) {
    const uint64_t w = VmmBuffer(p, "w", 1, 3);
    EXPECT_TRUE(Exported(p, w));
    return SteadyFdsOf(p.pid());
  }

  // Maps one chunk, `name`, whose background export the simulator holds
  // (`delay`: an inject_delay command), and returns it once that export has
  // begun (one more of the peer's threads asleep).
  uint64_t MapWithItsExportHeld(PeerProcess& p, const std::string& delay, const std::string& name,
                                int seed) {
    const int sleeping = SleepingThreads(p.pid());
    EXPECT_EQ(p.Call(delay), "ok");
    const uint64_t base = VmmBuffer(p, name, 1, seed);
    EXPECT_TRUE(WaitUntil([&] { return SleepingThreads(p.pid()) > sleeping; }, 5000))
        << name << "'s export did not start";
    return base;
  }

  std::string Report(std::unique_ptr<PeerProcess>* peer) {
    const std::string log = ExitLog(peer);
    EXPECT_NE(log.find("stats at exit:"), std::string::npos) << "no VMMIPC_STATS report";
    return log;
  }
};

// A chunk is exported soon after its map, one kept fd each, by one thread
// that the first map started; its get is then a lookup and its open works.
TEST_F(BackgroundExport, AMappedChunkIsExportedBeforeItsGetAndTheGetIsALookup) {
  const int per_map = FdsPerMap();
  auto exporter = ExportingPeer("exporter", "0");
  auto importer = Peer("importer", "1");
  ASSERT_TRUE(exporter && importer);
  // vmmipc's threads only (vmmipc-*): a sanitizer starts one of its own when it likes.
  const int threads = ThreadsOf(exporter->pid(), "vmmipc-");
  EXPECT_EQ(ThreadsOf(exporter->pid(), "vmmipc-export"), 0) << "a thread before any VMM map";
  const int warm = Warm(*exporter);
  EXPECT_EQ(ThreadsOf(exporter->pid(), "vmmipc-export"), 1);
  EXPECT_EQ(ThreadsOf(exporter->pid(), "vmmipc-"), threads + 1)
      << "more than the one thread at rest: " << ThreadNames(exporter->pid());
  const uint64_t a = VmmBuffer(*exporter, "a", 1, 11);
  ASSERT_TRUE(Exported(*exporter, a));
  EXPECT_EQ(SettledFdsOf(exporter->pid(), warm + per_map + 1), warm + per_map + 1)
      << "not one kept fd for the chunk";
  OpenCheckClose(*importer, Handle(*exporter, a), kChunk, 11);
  EXPECT_EQ(ThreadsOf(exporter->pid(), "vmmipc-export"), 1);
  const std::string report = Report(&exporter);
  EXPECT_EQ(StatsCounter(report, "background_exports"), 2u);
  EXPECT_EQ(StatsCounter(report, "fds_exported"), 2u) << "the get or the open exported again";
}

// No thread and no export in a process that maps no VMM memory, nor in one
// that maps it with the setting off (the default).
TEST_F(BackgroundExport, NoThreadWithoutAVmmMapNorWithTheSettingOff) {
  auto legacy_only = ExportingPeer("legacy", "0");
  auto off = Peer("off", "1", {{"VMMIPC_STATS", "1"}});
  ASSERT_TRUE(legacy_only && off);
  ASSERT_TRUE(StartsWith(legacy_only->Call("alloc_legacy " + Hex(kChunk)), "ok "));
  const int per_map = FdsPerMap();
  const int fresh = SteadyFdsOf(off->pid());
  const int threads = ThreadsOf(off->pid(), "vmmipc-");
  (void)VmmBuffer(*off, "a", 1, 12);
  EXPECT_EQ(SteadyFdsOf(off->pid()), fresh + per_map) << "exported with the setting off";
  EXPECT_EQ(ThreadsOf(off->pid(), "vmmipc-"), threads);
  EXPECT_EQ(ThreadsOf(legacy_only->pid(), "vmmipc-export"), 0);
  EXPECT_EQ(StatsCounter(Report(&off), "fds_exported"), 0u);
}

// A chunk freed before anyone asked keeps no fd: freed after its export (the
// fd closes with the unmap), and freed during it (the export is held by the
// simulator after its retain: the fd it makes is closed at once). Each cost
// one export.
TEST_F(BackgroundExport, AChunkFreedBeforeItIsSharedKeepsNoFd) {
  if (!Sim()) GTEST_SKIP() << "needs the simulator's delayed export";
  const int per_map = FdsPerMap();
  auto exporter = ExportingPeer("exporter", "0");
  ASSERT_TRUE(exporter);
  const int warm = Warm(*exporter);
  const uint64_t b = VmmBuffer(*exporter, "b", 1, 13);
  ASSERT_TRUE(Exported(*exporter, b));
  EXPECT_EQ(SettledFdsOf(exporter->pid(), warm + per_map + 1), warm + per_map + 1);
  EXPECT_EQ(exporter->Call("free_vmm b"), "ok");
  EXPECT_EQ(SettledFdsOf(exporter->pid(), warm), warm) << "b's fd outlived its free";

  const int sleeping = SleepingThreads(exporter->pid());
  ASSERT_EQ(exporter->Call("inject_delay cuMemExportToShareableHandle 1 2000"), "ok");
  const uint64_t c = VmmBuffer(*exporter, "c", 1, 14);
  ASSERT_TRUE(WaitUntil([&] { return SleepingThreads(exporter->pid()) > sleeping; }, 5000))
      << "c's export did not start";
  EXPECT_EQ(exporter->Call("free_vmm c"), "ok");
  ASSERT_TRUE(LogShows(*exporter,
                       "background export: " + Hex(c) + " was unmapped during its export", 10000));
  EXPECT_EQ(SettledFdsOf(exporter->pid(), warm), warm) << "c's fd outlived its free";
  const std::string report = Report(&exporter);
  EXPECT_EQ(StatsCounter(report, "fds_exported"), 3u) << "w, b, c: one export each";
  EXPECT_EQ(StatsCounter(report, "background_exports"), 2u);
}

// Nothing is exported while this process opens a handle: its open waits for
// an exporter that is stopped (SIGSTOP) until the test lets it go on.
TEST_F(BackgroundExport, NothingIsExportedWhileThisProcessOpens) {
  auto other = Peer("other", "2");
  auto exporter = ExportingPeer("exporter", "0", {{"VMMIPC_TIMEOUT_MS", "60000"}});
  ASSERT_TRUE(other && exporter);
  const std::string held = Handle(*other, VmmBuffer(*other, "h", 1, 15));
  (void)Warm(*exporter);
  ASSERT_EQ(kill(other->pid(), SIGSTOP), 0);
  // vmmipc's own threads poll too (the listener's, the follow thread): the
  // open's thread is one more than before it.
  const int polling = PollingThreads(exporter->pid(), false);
  ASSERT_EQ(exporter->Call("open_bg " + held + " h"), "ok");
  // The open waits in poll for the stopped exporter's answer.
  const bool waiting =
      WaitUntil([&] { return PollingThreads(exporter->pid(), false) > polling; }, 5000);
  const uint64_t b = VmmBuffer(*exporter, "b", 1, 16);
  const bool paused =
      LogShows(*exporter, "chunk(s) wait for the maps, unmaps, opens, requests or gets", 5000);
  const bool exported_meanwhile = Log(*exporter).find("exported " + Hex(b)) != std::string::npos;
  ASSERT_EQ(kill(other->pid(), SIGCONT), 0);
  EXPECT_TRUE(waiting) << "the open did not wait for the stopped exporter";
  EXPECT_TRUE(paused) << "the background export did not wait for the open";
  EXPECT_FALSE(exported_meanwhile) << "b was exported while the open ran";
  const std::string pointer = Value(exporter->Call("open_bg_result h", 30000));
  ASSERT_FALSE(pointer.empty());
  EXPECT_EQ(exporter->Call("check " + pointer + " " + Hex(kChunk) + " 15"), "ok");
  ASSERT_TRUE(Exported(*exporter, b)) << "b was not exported once the open ended";
  EXPECT_EQ(exporter->Call("close " + pointer), "ok");
}

// Nothing is exported while this process's listener serves a request: the
// request is for memory vmmipc did not see mapped, which the serving exports
// itself, held by the simulator meanwhile.
TEST_F(BackgroundExport, NothingIsExportedWhileTheListenerServes) {
  if (!Sim()) GTEST_SKIP() << "needs the simulator's unhooked map and delayed export";
  auto exporter = ExportingPeer("exporter", "0");
  auto importer = Peer("importer", "1");
  ASSERT_TRUE(exporter && importer);
  (void)Warm(*exporter);
  const uint64_t u = Num(Value(exporter->Call("alloc_vmm_untracked u " + Hex(kChunk))));
  ASSERT_NE(u, 0u);
  ASSERT_EQ(exporter->Call("fill " + Hex(u) + " " + Hex(kChunk) + " 17"), "ok");
  const std::string handle = Handle(*exporter, u);
  const int sleeping = SleepingThreads(exporter->pid());
  ASSERT_EQ(exporter->Call("inject_delay cuMemExportToShareableHandle 1 3000"), "ok");
  ASSERT_EQ(importer->Call("open_bg " + handle + " u"), "ok");
  ASSERT_TRUE(WaitUntil([&] { return SleepingThreads(exporter->pid()) > sleeping; }, 5000))
      << "the serving's export did not start";
  const uint64_t b = VmmBuffer(*exporter, "b", 1, 18);
  EXPECT_TRUE(
      LogShows(*exporter, "chunk(s) wait for the maps, unmaps, opens, requests or gets", 5000))
      << "the background export did not wait for the request being served";
  const std::string pointer = Value(importer->Call("open_bg_result u", 30000));
  ASSERT_FALSE(pointer.empty());
  EXPECT_EQ(importer->Call("check " + pointer + " " + Hex(kChunk) + " 17"), "ok");
  ASSERT_TRUE(Exported(*exporter, b));
  const std::string log = Log(*exporter);
  const size_t served = log.find("served " + Hex(u) + " to");
  ASSERT_NE(served, std::string::npos);
  EXPECT_LT(served, log.find("background export: exported " + Hex(b)))
      << "b was exported while the request was served";
  EXPECT_EQ(importer->Call("close " + pointer), "ok");
}

// Past half of VMMIPC_EXPORT_FD_CACHE a chunk is left to its get, which
// exports it as without the background export.
TEST_F(BackgroundExport, WithItsShareOfTheFdCacheFullTheGetExportsAsBefore) {
  auto exporter = ExportingPeer("exporter", "0", {{"VMMIPC_EXPORT_FD_CACHE", "4"}});
  auto importer = Peer("importer", "1");
  ASSERT_TRUE(exporter && importer);
  const uint64_t a = VmmBuffer(*exporter, "a", 1, 19);
  const uint64_t b = VmmBuffer(*exporter, "b", 1, 20);
  const uint64_t c = VmmBuffer(*exporter, "c", 1, 21);
  ASSERT_TRUE(Exported(*exporter, a));
  ASSERT_TRUE(Exported(*exporter, b));
  ASSERT_TRUE(LogShows(*exporter, "background export: " + Hex(c) + " left to its get"));
  OpenCheckClose(*importer, Handle(*exporter, a), kChunk, 19);  // a lookup; the listener starts
  const int before = SteadyFdsOf(exporter->pid());
  const std::string hc = Handle(*exporter, c);
  EXPECT_EQ(SettledFdsOf(exporter->pid(), before + 1), before + 1) << "the get did not export c";
  OpenCheckClose(*importer, hc, kChunk, 21);
  const std::string report = Report(&exporter);
  EXPECT_EQ(StatsCounter(report, "background_exports"), 2u);
  EXPECT_EQ(StatsCounter(report, "background_left_to_get"), 1u);
  EXPECT_EQ(StatsCounter(report, "fds_exported"), 3u);
}

// A fork while the thread holds a fresh export's fd (the simulator holds the
// export after its work): the fork waits for it to be cached, so the child,
// which closes its copies of the cache's fds, holds no exported fd at all;
// the parent keeps its exports, and its get and the peer's open work.
TEST_F(BackgroundExport, AForkDuringAnExportLeavesTheChildNoneOfIt) {
  if (!Sim()) GTEST_SKIP() << "needs the simulator's delayed export and a forked child";
  auto exporter = ExportingPeer("exporter", "0");
  auto importer = Peer("importer", "1");
  ASSERT_TRUE(exporter && importer);
  (void)Warm(*exporter);
  const uint64_t b = MapWithItsExportHeld(
      *exporter, "inject_delay_after cuMemExportToShareableHandle 1 2000", "b", 22);
  std::istringstream counts(Value(exporter->Call("fork_exported_fds", 30000)));
  int parent = -1, child = -1;
  counts >> parent >> child;
  EXPECT_EQ(child, 0) << "the child kept exported fds of its parent";
  EXPECT_EQ(parent, 3) << "w, b and the export keep-alive";
  ASSERT_TRUE(Exported(*exporter, b));
  OpenCheckClose(*importer, Handle(*exporter, b), kChunk, 22);
  EXPECT_EQ(StatsCounter(Report(&exporter), "fds_exported"), 2u);
}

// Nothing is exported while this process maps: the second chunk's map of b,
// held by the simulator, holds back the export of the first, queued before.
TEST_F(BackgroundExport, NothingIsExportedWhileThisProcessMaps) {
  if (!Sim()) GTEST_SKIP() << "needs the simulator's delayed map";
  auto exporter = ExportingPeer("exporter", "0");
  ASSERT_TRUE(exporter);
  (void)Warm(*exporter);
  const auto exports = [&] { return Occurrences(Log(*exporter), "background export: exported"); };
  const size_t before = exports();
  ASSERT_EQ(exporter->Call("inject_delay cuMemMap 2 3000"), "ok");
  std::string reply;
  std::thread alloc([&] { reply = exporter->Call("alloc_vmm b " + Hex(kChunk) + " 2", 30000); });
  const bool paused =
      LogShows(*exporter, "chunk(s) wait for the maps, unmaps, opens, requests or gets", 5000);
  const size_t meanwhile = exports();
  alloc.join();
  const uint64_t b = Num(Value(reply));
  ASSERT_NE(b, 0u) << reply;
  EXPECT_TRUE(paused) << "the background export did not wait for the map";
  EXPECT_EQ(meanwhile, before) << "a chunk was exported while b's second chunk was mapped";
  EXPECT_TRUE(Exported(*exporter, b)) << "b was not exported once the map ended";
  EXPECT_TRUE(Exported(*exporter, b + kChunk));
}

// Nor while it unmaps: c, mapped during a's held export, waits in the queue;
// z's unmap, held by the simulator, begins before a's export ends, so the
// thread, done with a, must find the unmap in progress and wait for it.
TEST_F(BackgroundExport, NothingIsExportedWhileThisProcessUnmaps) {
  if (!Sim()) GTEST_SKIP() << "needs the simulator's delayed export and unmap";
  auto exporter = ExportingPeer("exporter", "0");
  ASSERT_TRUE(exporter);
  (void)Warm(*exporter);
  const uint64_t z = VmmBuffer(*exporter, "z", 1, 31);
  ASSERT_TRUE(Exported(*exporter, z));
  const uint64_t a =
      MapWithItsExportHeld(*exporter, "inject_delay cuMemExportToShareableHandle 1 1500", "a", 32);
  const uint64_t c = VmmBuffer(*exporter, "c", 1, 33);
  const std::string waits = "chunk(s) wait for the maps, unmaps, opens, requests or gets";
  const size_t waited = Occurrences(Log(*exporter), waits);
  ASSERT_EQ(exporter->Call("inject_delay cuMemUnmap 1 3000"), "ok");
  std::string reply;
  std::thread unmap([&] { reply = exporter->Call("free_vmm z", 30000); });
  const bool a_exported = Exported(*exporter, a);
  const bool paused = WaitUntil([&] { return Occurrences(Log(*exporter), waits) > waited; }, 5000);
  const bool c_meanwhile =
      Log(*exporter).find("background export: exported " + Hex(c)) != std::string::npos;
  unmap.join();
  EXPECT_EQ(reply, "ok") << reply;
  EXPECT_TRUE(a_exported);
  EXPECT_TRUE(paused) << "the background export did not wait for the unmap";
  EXPECT_FALSE(c_meanwhile) << "c was exported while z was unmapped";
  EXPECT_TRUE(Exported(*exporter, c)) << "c was not exported once the unmap ended";
}

// An exit during an export waits for it: the driver tears itself down as the
// process exits, and an export that runs on into that crashes it. The
// simulator holds b's export; the exit comes meanwhile, and the export still
// ends (logged) before the process is gone.
TEST_F(BackgroundExport, AnExitDuringAnExportWaitsForIt) {
  if (!Sim()) GTEST_SKIP() << "needs the simulator's delayed export";
  auto exporter = ExportingPeer("exporter", "0");
  ASSERT_TRUE(exporter);
  (void)Warm(*exporter);
  const uint64_t b =
      MapWithItsExportHeld(*exporter, "inject_delay cuMemExportToShareableHandle 1 1500", "b", 23);
  ASSERT_EQ(Log(*exporter).find("background export: exported " + Hex(b)), std::string::npos)
      << "b's export ended before the exit";
  // No answer: its stdout closes when it has exited, exit handlers run.
  EXPECT_EQ(exporter->Call("exit_now 0", 30000), "");
  exporter->Kill();  // only reaps it
  const std::string log = ExitLog(&exporter);
  EXPECT_NE(log.find("background export: exported " + Hex(b)), std::string::npos)
      << "the process exited during b's export:\n"
      << log;
}

}  // namespace
}  // namespace vmmipc::testing
