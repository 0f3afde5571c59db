// After an exporter's first export (core/export/export_keepalive.h): the export keep-alive
// (VMMIPC_EXPORT_KEEPALIVE), one exported fd of a small allocation of its own
// kept until it exits, so that the driver's export state outlives the unmap of
// every exported chunk. And the fd table, grown for the exported-fd cache at
// load time while the process has one thread (core/load_time.h), not later.
// What is checked here is what a user can see: the keep-alive is made once, by the
// first export, whatever is mapped and unmapped later; it is one fd (and, on
// the simulated driver, which backs memory with a memfd, one allocation and
// its memfd) more than an exporter without it holds; with the switch off, or
// when its making fails, nothing of it is left; the fd table (FDSize in
// /proc/<pid>/status) is grown at load, and no share grows it; it is left
// alone with VMMIPC_ENABLE=0 and when the library is loaded into a process
// that already has threads. That the keep-alive keeps the driver's export
// state (its set-up skipped) and that a growth at load waits for no grace
// period are costs, not behaviours: docs/driver-behaviour.md#export-cliff and
// #fd-table-growth have them.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <string>

#include "e2e_layout.h"
#include "logged_peer_test.h"
#include "peer_process.h"

namespace vmmipc::testing {
namespace {

class ExportKeepAlive : public LoggedPeerTest {
 protected:
  void SetUp() override {
    LoggedPeerTest::SetUp();
    if (IsSkipped()) return;
    importer_ = Peer("importer", "1");
    ASSERT_NE(importer_, nullptr);
  }

  std::unique_ptr<PeerProcess> Exporter(const std::string& name, const std::string& anchor) {
    return Peer(name, "0",
                {{"VMMIPC_EXPORT_KEEPALIVE", anchor},
                 {"VMMIPC_STATS", "1"},
                 {"VMMIPC_LOG_LEVEL", "debug"}});
  }

  // One buffer's life in `exporter`: made, shared, opened, checked and closed
  // by the importer, freed. Returns what the exporter holds afterwards, once
  // the listener's worker is done with it (`settled_by`: a log line that says
  // so, past `from` bytes of the log) and the count has settled (the reply's
  // fds and connection close a moment after the importer has its answer).
  Resources ShareAndFree(PeerProcess& exporter, const std::string& name, int seed,
                         const std::string& settled_by, size_t from = 0) {
    const std::string handle = Handle(exporter, VmmBuffer(exporter, name, 1, seed));
    OpenCheckClose(*importer_, handle, kChunk, seed);
    EXPECT_EQ(exporter.Call("free_vmm " + name), "ok");
    if (!settled_by.empty()) {
      EXPECT_TRUE(LogShows(exporter, settled_by, 3000, from)) << Log(exporter);
    }
    return Steady(exporter);
  }

  // How much more `with` holds than `without`, each against its own baseline.
  static Resources Difference(const Resources& with, const Resources& with_before,
                              const Resources& without, const Resources& without_before) {
    Resources d;
    d.fds = (with.fds - with_before.fds) - (without.fds - without_before.fds);
    if (with.allocations >= 0)
      d.allocations = (with.allocations - with_before.allocations) -
                      (without.allocations - without_before.allocations);
    return d;
  }

  // One exported fd; on the simulated driver also the allocation and its memfd.
  static Resources OneAnchor() {
    Resources r;
    r.fds = Sim() ? 2 : 1;
    if (Sim()) r.allocations = 1;
    return r;
  }

  static Resources Nothing() {
    Resources r;
    r.fds = 0;
    if (Sim()) r.allocations = 0;
    return r;
  }

  // Shares one chunk of a fresh exporter (the anchor on) with the `nth` next
  // `function` call of its driver failing: armed once the buffer is made and
  // before the get, whose export ahead starts the warm-up at once. Expects
  // `logged` in its log and, once the chunk is freed, nothing of the anchor
  // left: the same resources as an exporter with the anchor off, which
  // shares the same. Returns the exporter.
  std::unique_ptr<PeerProcess> ShareWithAFailingAnchor(const std::string& function, int nth,
                                                       const std::string& logged) {
    auto with = Exporter("with", "1");
    auto without = Exporter("without", "0");
    if (with == nullptr || without == nullptr) return nullptr;
    const Resources with_before = Held(*with);
    const Resources without_before = Held(*without);
    const uint64_t base = VmmBuffer(*with, "a", 1, 6);
    EXPECT_TRUE(Inject(*with, function, nth, CUDA_ERROR_OUT_OF_MEMORY));
    OpenCheckClose(*importer_, Handle(*with, base), kChunk, 6);
    EXPECT_TRUE(LogShows(*with, logged)) << Log(*with);
    EXPECT_TRUE(LogShows(*with, "export warm-up done: fd table")) << Log(*with);
    EXPECT_EQ(with->Call("free_vmm a"), "ok");
    const Resources with_after = Steady(*with);
    const Resources without_after = ShareAndFree(*without, "a", 6, "export warm-up done");
    EXPECT_EQ(Difference(with_after, with_before, without_after, without_before), Nothing());
    return with;
  }

  std::unique_ptr<PeerProcess> importer_;
};

TEST_F(ExportKeepAlive, TheFirstExportLeavesOneAnchorThatOutlivesEveryUnmap) {
  auto with = Exporter("with", "1");
  auto without = Exporter("without", "0");
  const Resources with_before = Held(*with);
  const Resources without_before = Held(*without);
  const Resources with_after = ShareAndFree(*with, "a", 3, "export warm-up done");
  const Resources without_after = ShareAndFree(*without, "a", 3, "export warm-up done");
  EXPECT_TRUE(LogShows(*with, "export keep-alive kept")) << Log(*with);
  EXPECT_TRUE(LogShows(*without, "export keep-alive off")) << Log(*without);
  EXPECT_EQ(Difference(with_after, with_before, without_after, without_before), OneAnchor());
  // Later buffers, shared and freed in turn: no second anchor, nothing grows.
  const size_t from = Log(*with).size();
  EXPECT_EQ(ShareAndFree(*with, "b", 4, ""), with_after);
  EXPECT_EQ(ShareAndFree(*with, "c", 5, ""), with_after);
  EXPECT_EQ(Log(*with).find("export keep-alive", from), std::string::npos);
  EXPECT_EQ(StatsCounter(ExitLog(&with), "export_keepalives"), 1u);
  EXPECT_EQ(StatsCounter(ExitLog(&without), "export_keepalives"), 0u);
}

// FDSize of process `pid`; -1 when unknown.
int FdTableSizeOf(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("FDSize:", 0) == 0) return std::stoi(line.substr(7));
  return -1;
}

// The size the library grows the table to at load: twice the exported-fd
// cache's default bound (1024, at most a quarter of the soft limit), within
// the soft limit (core/load_time.h).
long GrownAtLoad() {
  rlimit limit{};
  EXPECT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);  // the peers inherit it
  const long soft = limit.rlim_cur == RLIM_INFINITY ? 1L << 20 : static_cast<long>(limit.rlim_cur);
  return std::min(2 * std::min(1024L, soft / 4), soft);
}

TEST_F(ExportKeepAlive, TheFdTableIsGrownAtLoadAndNoShareGrowsIt) {
  const long want = GrownAtLoad();
  // Another cache bound than the default: the table is sized for the default
  // all the same (the configuration is not read at load time).
  auto exporter =
      Peer("exporter", "0", {{"VMMIPC_EXPORT_FD_CACHE", "300"}, {"VMMIPC_LOG_LEVEL", "debug"}});
  const long at_start = FdTableSizeOf(exporter->pid());
  EXPECT_GE(at_start, want) << "the table was not grown at load";
  const std::string handle = Handle(*exporter, VmmBuffer(*exporter, "a", 1, 9));
  OpenCheckClose(*importer_, handle, kChunk, 9);
  ASSERT_TRUE(LogShows(*exporter, "export warm-up done: fd table ")) << Log(*exporter);
  EXPECT_TRUE(LogShows(*exporter, "(grown at load, ")) << Log(*exporter);
  const std::string second = Handle(*exporter, VmmBuffer(*exporter, "b", 1, 10));
  OpenCheckClose(*importer_, second, kChunk, 10);
  EXPECT_EQ(FdTableSizeOf(exporter->pid()), at_start);
  EXPECT_GE(FdTableSizeOf(importer_->pid()), want);
}

TEST_F(ExportKeepAlive, VmmipcOffLeavesTheFdTableAlone) {
  const long want = GrownAtLoad();
  auto off = Peer("off", "0", {{"VMMIPC_ENABLE", "0"}});
  ASSERT_NE(off, nullptr);
  EXPECT_LT(FdTableSizeOf(off->pid()), want);
}

// dlopen'ed into a process that already runs two threads: growing there would
// wait for a grace period (on the loading thread, and on any thread that opens
// an fd meanwhile), so the table is left as it is.
TEST_F(ExportKeepAlive, ALibraryLoadedLateIntoAThreadedProcessLeavesTheFdTableAlone) {
  const long want = GrownAtLoad();
  auto late = PeerProcess::Start({{"VMMIPC_RANK", "0"}}, /*preload=*/false);
  ASSERT_NE(late, nullptr);
  const long before = FdTableSizeOf(late->pid());
  ASSERT_LT(before, want);
  ASSERT_EQ(late->Call(std::string("load_late ") + VMMIPC_LIBRARY_PATH), "ok");
  EXPECT_EQ(FdTableSizeOf(late->pid()), before);
}

// --- failures: the anchor only saves time, so none of these fails a share ---

TEST_F(ExportKeepAlive, NoMemoryForTheAnchorLeavesNothingAndSharesWork) {
  if (!Sim()) {
    GTEST_SKIP() << "fault injection needs the simulated driver";
  }
  // The buffer's cuMemCreate comes first; the next one is the anchor's.
  auto with = ShareWithAFailingAnchor(
      "cuMemCreate", 1,
      "export keep-alive: none (cuMemCreate on device 0: CUDA_ERROR_OUT_OF_MEMORY)");
  ASSERT_NE(with, nullptr);
  // Not tried again: the next share works, makes none and leaves nothing.
  const Resources after = Steady(*with);
  EXPECT_EQ(ShareAndFree(*with, "b", 7, ""), after);
  EXPECT_EQ(StatsCounter(ExitLog(&with), "export_keepalives"), 0u);
}

TEST_F(ExportKeepAlive, AnAnchorThatCannotBeExportedIsReleased) {
  if (!Sim()) {
    GTEST_SKIP() << "fault injection needs the simulated driver";
  }
  // The anchor is made before the process's first export of a chunk: its export is the first.
  auto with = ShareWithAFailingAnchor("cuMemExportToShareableHandle", 1,
                                      "export keep-alive: none (cuMemExportToShareableHandle on "
                                      "device 0: CUDA_ERROR_OUT_OF_MEMORY)");
  ASSERT_NE(with, nullptr);
  EXPECT_EQ(StatsCounter(ExitLog(&with), "export_keepalives"), 0u);
}

}  // namespace
}  // namespace vmmipc::testing
