// What a user sees of vmmipc in real processes (issue 16): log lines in
// VMMIPC_LOG_FILE (per pid with %p, a forked child in its own file), the
// fallback to stderr when the file cannot be opened or used (a FIFO), the
// effective configuration printed once, configuration warnings tagged with
// the rank, sizes in human units, and a VMMIPC_STATS report without empty
// sections.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "e2e_layout.h"
#include "peer_process.h"

namespace vmmipc::testing {
namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

size_t Count(const std::string& text, const std::string& what) {
  size_t count = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++count;
  return count;
}

std::string HostName() {
  char name[256] = {};
  return gethostname(name, sizeof(name) - 1) == 0 ? name : "";
}

class Observability : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!DriverAvailable(&why)) GTEST_SKIP() << why;
    std::string dir = ::testing::TempDir() + "vmmipc-obs-XXXXXX";
    ASSERT_NE(mkdtemp(dir.data()), nullptr);
    dir_ = dir;
  }
  void TearDown() override {
    if (HasFailure()) {
      for (const auto& entry : std::filesystem::directory_iterator(dir_))
        std::cerr << "---- " << entry.path() << " ----\n" << Read(entry.path()) << "\n";
    }
    std::filesystem::remove_all(dir_);
  }

  // A started peer whose stderr goes to dir_/stderr.<name>, then initialised.
  std::unique_ptr<PeerProcess> Peer(const std::string& name, const std::string& rank,
                                    std::map<std::string, std::string> env) {
    env.emplace("VMMIPC_RANK", rank);
    env.emplace("LOCAL_RANK", kUnset);
    env.emplace("RANK", kUnset);
    auto peer = PeerProcess::Start(env);
    if (peer == nullptr) {
      ADD_FAILURE() << "cannot start " << name;
      return nullptr;
    }
    EXPECT_EQ(peer->Call("redirect_stderr " + Stderr(name)), "ok");
    EXPECT_EQ(peer->Call("init"), "ok");
    return peer;
  }
  std::string Stderr(const std::string& name) const { return dir_ + "/stderr." + name; }

  // Exports one 2-chunk buffer of `p`; returns the handle.
  std::string Export(PeerProcess& p, const std::string& name) {
    const std::string base = Value(p.Call("alloc_vmm " + name + " " + Hex(kChunk) + " 2"));
    EXPECT_FALSE(base.empty());
    const std::string handle = Value(p.Call("get " + base));
    EXPECT_EQ(handle.size(), 128u);
    return handle;
  }

  std::string dir_;
};

TEST_F(Observability, LinesGoToTheLogFileNamedByHostAndPidAndNotToStderr) {
  auto exporter =
      Peer("exporter", "0",
           {{"VMMIPC_LOG_FILE", dir_ + "/vmmipc.%h.%p.log"}, {"VMMIPC_LOG_LEVEL", "info"}});
  ASSERT_NE(exporter, nullptr);
  Export(*exporter, "a");
  const std::string pid = Value(exporter->Call("pid"));
  const std::string log = Read(dir_ + "/vmmipc." + HostName() + "." + pid + ".log");
  const std::string tag = "[vmmipc pid " + pid + " rank 0] ";
  // The effective configuration, once, with what differs from the defaults and the rank.
  EXPECT_EQ(Count(log, "info: config: "), 1u) << log;
  EXPECT_NE(log.find(tag + "info: config: VMMIPC_LOG_LEVEL=info VMMIPC_LOG_FILE=" + dir_ +
                     "/vmmipc.%h.%p.log "),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("(others default); rank 0 from VMMIPC_RANK\n"), std::string::npos) << log;
  // Sizes in human units, addresses in hex.
  EXPECT_TRUE(
      std::regex_search(log, std::regex("info: export arena at 0x[0-9a-f]+: [0-9]+ [KMGT]iB\n")))
      << log;
  EXPECT_EQ(Read(Stderr("exporter")).find("[vmmipc"), std::string::npos)
      << Read(Stderr("exporter"));
}

TEST_F(Observability, ALogFileThatCannotBeOpenedFallsBackToStderrWithOneWarning) {
  const std::string pattern = dir_ + "/no-such-dir/vmmipc.%p.log";
  auto exporter =
      Peer("exporter", "0", {{"VMMIPC_LOG_FILE", pattern}, {"VMMIPC_LOG_LEVEL", "info"}});
  ASSERT_NE(exporter, nullptr);
  const std::string handle = Export(*exporter, "a");  // nothing crashed: it still exports
  auto importer = Peer("importer", "1", {{"VMMIPC_LOG_FILE", pattern}});
  ASSERT_NE(importer, nullptr);
  const std::string ptr = Value(importer->Call("open " + handle));
  EXPECT_FALSE(ptr.empty());
  EXPECT_EQ(importer->Call("close " + ptr), "ok");
  const std::string pid = Value(exporter->Call("pid"));
  const std::string err = Read(Stderr("exporter"));
  EXPECT_NE(err.find("[vmmipc pid " + pid + " rank 0] warning: cannot open VMMIPC_LOG_FILE '" +
                     dir_ + "/no-such-dir/vmmipc." + pid + ".log' (from '" + pattern +
                     "'): No such file or directory; logging to stderr\n"),
            std::string::npos)
      << err;
  EXPECT_EQ(Count(err, "cannot open VMMIPC_LOG_FILE"), 1u) << err;
  EXPECT_NE(err.find("info: config: "), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/no-such-dir"));
}

// Issue 26: a FIFO planted at the log file's name hung the process at its
// first log line (the open waited for a reader, holding the process state's
// creation lock). Now it is refused at once: the exporter exports, and its
// lines, after one warning, are on stderr.
TEST_F(Observability, AFifoAtTheLogFileNameIsRefusedWithoutWaiting) {
  const std::string fifo = dir_ + "/vmmipc.log";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  auto exporter = Peer("exporter", "0", {{"VMMIPC_LOG_FILE", fifo}, {"VMMIPC_LOG_LEVEL", "info"}});
  ASSERT_NE(exporter, nullptr);
  EXPECT_EQ(Export(*exporter, "a").size(), 128u);
  const std::string pid = Value(exporter->Call("pid"));
  const std::string err = Read(Stderr("exporter"));
  EXPECT_NE(err.find("[vmmipc pid " + pid + " rank 0] warning: cannot use VMMIPC_LOG_FILE '" +
                     fifo + "': it is a FIFO (uid " + std::to_string(geteuid()) +
                     ", mode 0600), not a regular file (open: No such device or address); "
                     "logging to stderr\n"),
            std::string::npos)
      << err;
  EXPECT_EQ(Count(err, "VMMIPC_LOG_FILE '"), 1u) << err;
  EXPECT_NE(err.find("info: config: "), std::string::npos) << err;
}

// Issue 26: an application that retried a failing open in a loop got one
// warning per call (455,000 lines in 8 s). Now at most 20 per 10 s, one line
// saying the rest are left out, and one with their count in the next window;
// every open still returns the same error.
TEST_F(Observability, ARetriedFailingOpenLogsABoundedNumberOfLines) {
  auto exporter = Peer("exporter", "0", {});
  ASSERT_NE(exporter, nullptr);
  const std::string handle = Export(*exporter, "a");
  const std::string exporter_pid = Value(exporter->Call("pid"));
  exporter->Kill();  // nobody listens for the handle any more
  auto importer = Peer("importer", "1",
                       {{"VMMIPC_LOG_FILE", dir_ + "/importer.log"}, {"VMMIPC_LOG_LEVEL", "warn"}});
  ASSERT_NE(importer, nullptr);
  const std::string answer = importer->Call("open_repeat 10000 " + handle, 120000);
  std::smatch m;
  ASSERT_TRUE(
      std::regex_match(answer, m, std::regex("ok CUDA_ERROR_INVALID_HANDLE x10000 ms (\\d+)")))
      << answer;
  const long windows = 1 + std::stol(m[1]) / 10000;  // each 10 s may write 20 more
  const std::string log = Read(dir_ + "/importer.log");
  const std::string shown = log.substr(0, 4000);  // of a failure: not 10,000 lines
  const size_t failures = Count(log, "] warning: cuIpcOpenMemHandle(pid " + exporter_pid);
  EXPECT_GE(failures, 20u) << shown;
  EXPECT_LE(failures, 20u * windows) << shown;
  // Nothing else: the failures and the limit's own lines.
  EXPECT_EQ(Count(log, "\n"), failures + Count(log, "cuIpcOpenMemHandle: ")) << shown;
  EXPECT_NE(log.find("] warning: cuIpcOpenMemHandle: more than 20 warnings within 10 s; the rest "
                     "are counted, not logged, until then\n"),
            std::string::npos)
      << shown;
  EXPECT_LE(Count(log, "cuIpcOpenMemHandle: "), 2u * windows) << shown;
}

// With %p the forked child's lines go to its own file; the parent's file has none of them.
TEST_F(Observability, AForkedChildLogsToItsOwnFile) {
  if (DriverUnderTest() != DriverKind::kSimulated)
    GTEST_SKIP() << "a forked child cannot use the real driver";
  auto exporter = Peer("exporter", "0",
                       {{"VMMIPC_LOG_FILE", dir_ + "/v.%p.log"}, {"VMMIPC_LOG_LEVEL", "info"}});
  ASSERT_NE(exporter, nullptr);
  Export(*exporter, "a");
  const std::string pid = Value(exporter->Call("pid"));
  const std::string forked = exporter->Call("fork_export 1 5", 30000);
  ASSERT_EQ(forked.rfind("ok ", 0), 0u) << forked;
  const std::string child = Value(forked).substr(0, Value(forked).find(' '));
  EXPECT_EQ(exporter->Call("reap " + child, 30000), "ok exit=0");
  const std::string parent_log = Read(dir_ + "/v." + pid + ".log");
  const std::string child_log = Read(dir_ + "/v." + child + ".log");
  // Each listens under its own instance id (a forked child gets a new one).
  const std::regex listening("listening on @vmmipc\\." + std::to_string(geteuid()) +
                             "\\.i([0-9a-f]{8})");
  std::smatch parent_name, child_name;
  EXPECT_TRUE(std::regex_search(parent_log, parent_name, listening)) << parent_log;
  EXPECT_EQ(parent_log.find("pid " + child), std::string::npos) << parent_log;
  EXPECT_NE(child_log.find("[vmmipc pid " + child + " rank 0] info: config: "), std::string::npos)
      << child_log;
  EXPECT_TRUE(std::regex_search(child_log, child_name, listening)) << child_log;
  if (!parent_name.empty() && !child_name.empty()) {
    EXPECT_NE(parent_name[1].str(), child_name[1].str());
  }
}

// Warnings about the environment are printed with the rank already known (and
// into the log file): not "unranked" as before.
TEST_F(Observability, ConfigurationWarningsCarryTheRank) {
  auto peer = Peer("peer", "0",
                   {{"VMMIPC_LOG_FILE", dir_ + "/v.log"},
                    {"VMMIPC_LOG_LEVEL", "warn"},
                    {"VMMIPC_TIMEOUT_MS", "0"}});
  ASSERT_NE(peer, nullptr);
  Export(*peer, "a");
  const std::string pid = Value(peer->Call("pid"));
  const std::string log = Read(dir_ + "/v.log");
  EXPECT_NE(log.find("[vmmipc pid " + pid +
                     " rank 0] warning: ignoring VMMIPC_TIMEOUT_MS='0': "
                     "must be between 1 and 3600000; using the default 5000\n"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("unranked"), std::string::npos) << log;
  EXPECT_EQ(log.find("info:"), std::string::npos) << log;  // the level applies to the file
}

// The exit report of an exporter that never imported: no row of import zeros.
TEST_F(Observability, StatsReportLeavesOutSectionsWhereNothingHappened) {
  auto exporter =
      Peer("exporter", "0", {{"VMMIPC_LOG_FILE", dir_ + "/v.%p.log"}, {"VMMIPC_STATS", "1"}});
  ASSERT_NE(exporter, nullptr);
  const std::string handle = Export(*exporter, "a");
  auto importer =
      Peer("importer", "1", {{"VMMIPC_LOG_FILE", dir_ + "/v.%p.log"}, {"VMMIPC_STATS", "1"}});
  ASSERT_NE(importer, nullptr);
  const std::string ptr = Value(importer->Call("open " + handle));
  EXPECT_EQ(importer->Call("close " + ptr), "ok");
  const std::string exporter_pid = Value(exporter->Call("pid"));
  const std::string importer_pid = Value(importer->Call("pid"));
  exporter.reset();  // "exit": a normal exit runs the report
  importer.reset();
  const std::string exported = Read(dir_ + "/v." + exporter_pid + ".log");
  const std::string imported = Read(dir_ + "/v." + importer_pid + ".log");
  EXPECT_NE(exported.find("info:   export: handles_exported=1 "), std::string::npos) << exported;
  EXPECT_NE(exported.find("info:   listener: requests_served=1 "), std::string::npos) << exported;
  EXPECT_NE(exported.find("info:   import: none\n"), std::string::npos) << exported;
  EXPECT_NE(exported.find("info:   open failures: none\n"), std::string::npos) << exported;
  EXPECT_NE(imported.find("info:   export: none\n"), std::string::npos) << imported;
  EXPECT_NE(imported.find("info:   listener: none\n"), std::string::npos) << imported;
  EXPECT_NE(imported.find("info:   import: handles_opened=1 "), std::string::npos) << imported;
  EXPECT_NE(imported.find("(mapped 4 MiB, unmapped 4 MiB)\n"), std::string::npos) << imported;
}

}  // namespace
}  // namespace vmmipc::testing
