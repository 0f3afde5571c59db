// The log: VMMIPC_LOG_FILE's name expansion, lines in the file and not on
// stderr, the fallback to stderr with one warning (also for what must not be
// written: a FIFO, a symbolic link, another user's file, one others can
// write), a forked child's own file, and the byte-count formatter of log
// lines.
#include "common/log.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace vmmipc::log {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

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

class LogFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir = ::testing::TempDir() + "vmmipc-log-XXXXXX";
    ASSERT_NE(mkdtemp(dir.data()), nullptr);
    dir_ = dir;
    SetLevel(Level::kInfo);
    SetRank(-1);
  }
  void TearDown() override {
    SetFile("");
    SetLevel(Level::kWarn);
    std::filesystem::remove_all(dir_);
  }
  // Forks a child that runs `body` and exits 0; returns its pid once it has
  // exited (-1, with a failure, when fork fails).
  template <typename Body>
  pid_t RunInChild(Body body) {
    const pid_t child = fork();
    if (child < 0) {
      ADD_FAILURE() << "fork failed";
      return -1;
    }
    if (child == 0) {
      body();
      _exit(0);
    }
    int status = 0;
    EXPECT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
    return child;
  }
  // Runs `body` in a forked child whose stderr goes to a file; returns what
  // the child wrote there. The wait is bounded, on the child's end of a pipe
  // (closed when it exits), not a sleep: a child still running after 10 s
  // (a log line stuck in the file's open) is killed, and the test fails.
  template <typename Body>
  std::string StderrOfChild(Body body) {
    const std::string err_path = dir_ + "/child.stderr";
    int done[2];
    if (pipe2(done, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "pipe2 failed";
      return "";
    }
    const pid_t child = fork();
    if (child == 0) {
      close(done[0]);
      const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (err < 0 || dup2(err, STDERR_FILENO) != STDERR_FILENO) _exit(2);
      body();
      _exit(0);  // closes done[1]: the parent's poll returns
    }
    close(done[1]);
    if (child < 0) {
      close(done[0]);
      ADD_FAILURE() << "fork failed";
      return "";
    }
    pollfd end = {done[0], POLLIN, 0};
    int ready;
    do {
      ready = poll(&end, 1, 10000);
    } while (ready < 0 && errno == EINTR);
    close(done[0]);
    if (ready == 0) {
      kill(child, SIGKILL);
      ADD_FAILURE() << "the child's log lines did not return within 10 s (blocked opening "
                       "VMMIPC_LOG_FILE?)";
    }
    int status = 0;
    EXPECT_EQ(waitpid(child, &status, 0), child);
    if (ready > 0) {
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
    }
    return Read(err_path);
  }
  // In a child: VMMIPC_LOG_FILE names `path`, two lines are logged; returns
  // the child's stderr, which must hold the one warning and both lines.
  std::string LogTwoLinesTo(const std::string& path) {
    const std::string err = StderrOfChild([&] {
      SetFile(path);
      VMMIPC_LOG_WARN("first line");
      VMMIPC_LOG_WARN("second line");
    });
    EXPECT_EQ(Count(err, "VMMIPC_LOG_FILE"), 1u) << err;
    EXPECT_THAT(err, HasSubstr("] warning: first line\n"));
    EXPECT_THAT(err, HasSubstr("] warning: second line\n"));
    EXPECT_LT(err.find("VMMIPC_LOG_FILE"), err.find("first line")) << err;
    return err;
  }
  std::string dir_;
};

// A file of this test's own, empty, with `mode` (not masked by the umask).
void MakeFile(const std::string& path, mode_t mode) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0) << path;
  EXPECT_EQ(fchmod(fd, mode), 0);
  close(fd);
}

uintmax_t SizeOf(const std::string& path) { return std::filesystem::file_size(path); }

// The warning that VMMIPC_LOG_FILE `path` is not used, because `why`.
std::string Refused(const std::string& path, const std::string& why) {
  return "] warning: cannot use VMMIPC_LOG_FILE '" + path + "': " + why + "; logging to stderr\n";
}

// `why` for something of ours at the name that is not a regular file.
std::string NotARegularFile(const std::string& kind, const std::string& mode) {
  return "it is " + kind + " (uid " + std::to_string(geteuid()) + ", mode " + mode +
         "), not a regular file";
}

TEST(LogFileName, HostAndPidAreExpanded) {
  EXPECT_EQ(ExpandFileName("/tmp/vmmipc.%h.%p.log", "node7", 4242), "/tmp/vmmipc.node7.4242.log");
  EXPECT_EQ(ExpandFileName("%p%p", "h", 12), "1212");
  EXPECT_EQ(ExpandFileName("plain.log", "h", 12), "plain.log");
  EXPECT_EQ(ExpandFileName("", "h", 12), "");
  // %% is a percent sign; other sequences and a trailing % are kept as written.
  EXPECT_EQ(ExpandFileName("a%%p", "h", 12), "a%p");
  EXPECT_EQ(ExpandFileName("a%q%d%", "h", 12), "a%q%d%");
}

TEST(LogBytes, WholeUnitsWhenExactOneDecimalWhenNotBytesWhenSmall) {
  EXPECT_EQ(Bytes(0), "0 bytes");
  EXPECT_EQ(Bytes(512), "512 bytes");
  EXPECT_EQ(Bytes(1023), "1023 bytes");
  EXPECT_EQ(Bytes(1024), "1 KiB");
  EXPECT_EQ(Bytes(4u << 20), "4 MiB");
  EXPECT_EQ(Bytes((7u << 20) / 2), "3.5 MiB");
  EXPECT_EQ(Bytes((4u << 20) + 1), "4.0 MiB");  // not exact: the decimal says so
  EXPECT_EQ(Bytes(0x10000000000ull), "1 TiB");
  EXPECT_EQ(Bytes(0x80000000000ull), "8 TiB");
  EXPECT_EQ(Bytes(100ull << 40), "100 TiB");
  EXPECT_EQ(Bytes(1ull << 63), "8 EiB");
  EXPECT_EQ(Bytes(~0ull), "16.0 EiB");
}

TEST_F(LogFileTest, LinesGoToTheFileNotToStderr) {
  const mode_t old_mask = umask(022);
  SetFile(dir_ + "/vmmipc.%h.%p.log");
  ::testing::internal::CaptureStderr();
  VMMIPC_LOG_INFO("first line {}", 1);
  VMMIPC_LOG_WARN("second line");
  VMMIPC_LOG_DEBUG("below the level");
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  umask(old_mask);
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  const std::string path =
      dir_ + "/vmmipc." + std::string(host) + "." + std::to_string(getpid()) + ".log";
  const std::string text = Read(path);
  const std::string prefix = "[vmmipc pid " + std::to_string(getpid()) + " ";
  EXPECT_THAT(text, HasSubstr(prefix));
  EXPECT_THAT(text, HasSubstr("] info: first line 1\n"));
  EXPECT_THAT(text, HasSubstr("] warning: second line\n"));
  EXPECT_THAT(text, Not(HasSubstr("below the level")));
  struct stat st = {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // The file's descriptor is close-on-exec.
  bool found = false;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    if (std::filesystem::read_symlink(entry.path(), error).string() != path) continue;
    found = true;
    const int fd = std::stoi(entry.path().filename().string());
    EXPECT_TRUE(fcntl(fd, F_GETFD) & FD_CLOEXEC) << "fd " << fd;
    // Opened with O_NONBLOCK (so that the open cannot wait), then cleared.
    EXPECT_FALSE(fcntl(fd, F_GETFL) & O_NONBLOCK) << "fd " << fd;
  }
  EXPECT_TRUE(found);
  // Appended, never truncated: lines written before survive a later open.
  SetFile("");
  SetFile(dir_ + "/vmmipc.%h.%p.log");
  VMMIPC_LOG_INFO("third line");
  const std::string again = Read(path);
  EXPECT_THAT(again, HasSubstr("first line 1"));
  EXPECT_THAT(again, HasSubstr("third line"));
}

// Without OpenFile (a logger used alone, or a forked child's own %p file).
TEST_F(LogFileTest, NothingIsOpenedBeforeTheFirstLine) {
  SetFile(dir_ + "/lazy.log");
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/lazy.log"));
  VMMIPC_LOG_DEBUG("below the level: not written, nothing opened");
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/lazy.log"));
  VMMIPC_LOG_INFO("now");
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/lazy.log"));
}

// OpenFile (config::Get() calls it as it reads the configuration) opens the
// file, or gives it up with its warning, before any line: nothing more at
// the first line.
TEST_F(LogFileTest, OpenFileOpensItBeforeAnyLine) {
  SetFile(dir_ + "/early.log");
  OpenFile();
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/early.log"));
  EXPECT_EQ(SizeOf(dir_ + "/early.log"), 0u);
  VMMIPC_LOG_INFO("a line");
  EXPECT_THAT(Read(dir_ + "/early.log"), HasSubstr("] info: a line\n"));
  const std::string err = StderrOfChild([&] {
    SetFile(dir_ + "/no-such-dir/x.log");
    SetLevel(Level::kOff);  // the refusal is said whatever the level: it is why nothing is filed
    OpenFile();
    std::fputs("after OpenFile\n", stderr);
    std::fflush(stderr);
    SetLevel(Level::kInfo);
    VMMIPC_LOG_INFO("later line");
  });
  EXPECT_EQ(Count(err, "VMMIPC_LOG_FILE"), 1u) << err;
  EXPECT_LT(err.find("cannot open VMMIPC_LOG_FILE"), err.find("after OpenFile")) << err;
  EXPECT_LT(err.find("after OpenFile"), err.find("] info: later line\n")) << err;
}

// FileProblem (vmmipc-config's judgement) says what the open would, and creates nothing.
TEST_F(LogFileTest, FileProblemSaysWhatTheOpenWouldWithoutCreating) {
  EXPECT_EQ(FileProblem(""), "");
  EXPECT_EQ(FileProblem(dir_ + "/new.%p.log"), "");
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
  const std::string missing = dir_ + "/no-such-dir/x.log";
  EXPECT_EQ(FileProblem(missing), "cannot open VMMIPC_LOG_FILE '" + missing +
                                      "': No such file or directory; logging to stderr");
  EXPECT_THAT(FileProblem(dir_),
              HasSubstr("cannot use VMMIPC_LOG_FILE '" + dir_ + "': it is a directory"));
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT(FileProblem(fifo), HasSubstr("it is a FIFO"));
  const std::string open_to_all = dir_ + "/open.log";
  MakeFile(open_to_all, 0666);
  EXPECT_THAT(FileProblem(open_to_all), HasSubstr("it is writable by its group and others"));
  EXPECT_EQ(FileProblem(std::string(5000, 'x')),
            "cannot use VMMIPC_LOG_FILE: the name is longer than 4095 bytes; logging to stderr");
  // The same words as the library's own refusal.
  std::string said;
  {
    ::testing::internal::CaptureStderr();
    SetFile(missing);
    OpenFile();
    said = ::testing::internal::GetCapturedStderr();
  }
  EXPECT_THAT(said, HasSubstr("] warning: " + FileProblem(missing) + "\n"));
}

TEST_F(LogFileTest, AFileThatCannotBeOpenedFallsBackToStderrWithOneWarning) {
  const std::string pattern = dir_ + "/no-such-dir/vmmipc.%p.log";
  const std::string path = dir_ + "/no-such-dir/vmmipc." + std::to_string(getpid()) + ".log";
  SetFile(pattern);
  ::testing::internal::CaptureStderr();
  VMMIPC_LOG_INFO("line one");
  VMMIPC_LOG_INFO("line two");
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, HasSubstr("] warning: cannot open VMMIPC_LOG_FILE '" + path + "' (from '" +
                             pattern + "'): No such file or directory; logging to stderr\n"));
  EXPECT_EQ(Count(err, "cannot open VMMIPC_LOG_FILE"), 1u) << err;
  EXPECT_THAT(err, HasSubstr("] info: line one\n"));
  EXPECT_THAT(err, HasSubstr("] info: line two\n"));
  // The warning comes first: it explains where the lines that follow went.
  EXPECT_LT(err.find("cannot open"), err.find("line one"));
}

TEST_F(LogFileTest, ADirectoryIsNotALogFile) {
  const std::string sub = dir_ + "/sub";
  ASSERT_EQ(mkdir(sub.c_str(), 0700), 0);
  const std::string err = LogTwoLinesTo(sub);
  EXPECT_THAT(err, HasSubstr(Refused(
                       sub, NotARegularFile("a directory", "0700") + " (open: Is a directory)")));
}

// Issue 26: a FIFO planted at the name (in a directory others can write)
// made the first log line wait for a reader for ever, holding the logger's
// mutex and whatever lock its caller held. With nobody reading, the open
// fails at once (O_NONBLOCK: ENXIO).
TEST_F(LogFileTest, AFifoWithoutAReaderIsRefusedWithoutWaiting) {
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::string err = LogTwoLinesTo(fifo);
  EXPECT_THAT(err, HasSubstr(Refused(fifo, NotARegularFile("a FIFO", "0600") +
                                               " (open: No such device or address)")));
}

// With a reader the open succeeds; what it opened is refused on the fd, and
// the reader gets nothing.
TEST_F(LogFileTest, AFifoWithAReaderIsRefusedAndGetsNothing) {
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const int reader = open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(reader, 0);
  const std::string err = LogTwoLinesTo(fifo);
  EXPECT_THAT(err, HasSubstr(Refused(fifo, NotARegularFile("a FIFO", "0600"))));
  char byte = 0;
  EXPECT_LE(read(reader, &byte, 1), 0) << "the FIFO's reader got log lines";
  close(reader);
}

// A symbolic link at the name (to a victim's file, or to where one would be
// created) is not followed: O_NOFOLLOW fails with ELOOP, said plainly.
TEST_F(LogFileTest, ASymbolicLinkIsNotFollowed) {
  const std::string victim = dir_ + "/victim";
  MakeFile(victim, 0600);
  const std::string link = dir_ + "/link";
  ASSERT_EQ(symlink(victim.c_str(), link.c_str()), 0);
  const std::string err = LogTwoLinesTo(link);
  EXPECT_THAT(err, HasSubstr(Refused(link, "it is a symbolic link (to '" + victim +
                                               "'), and symbolic links are not followed (open: "
                                               "Too many levels of symbolic links)")));
  EXPECT_EQ(SizeOf(victim), 0u);
  // A dangling link does not create its target either.
  const std::string dangling = dir_ + "/dangling";
  ASSERT_EQ(symlink((dir_ + "/created").c_str(), dangling.c_str()), 0);
  EXPECT_THAT(LogTwoLinesTo(dangling), HasSubstr("it is a symbolic link"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/created"));
}

// A hard link at the name (where fs.protected_hardlinks is 0, another user
// can link any file they can see, one of ours included: a shell's profile)
// would have our lines appended to that file: refused on the fd's link count.
TEST_F(LogFileTest, AHardLinkIsNotWritten) {
  const std::string victim = dir_ + "/victim";
  MakeFile(victim, 0600);
  const std::string link = dir_ + "/hardlink";
  ASSERT_EQ(::link(victim.c_str(), link.c_str()), 0);
  const std::string err = LogTwoLinesTo(link);
  EXPECT_THAT(err, HasSubstr(Refused(link,
                                     "it has 2 links (a hard link: another name of a file "
                                     "that may be any of ours), and hard links are not "
                                     "written (mode 0600)")));
  EXPECT_EQ(SizeOf(victim), 0u);
}

// A file another user owns (and lets us write, or we are root): theirs to
// read, so not ours to write to.
TEST_F(LogFileTest, AnotherUsersFileIsNotWritten) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a file to another uid";
  const std::string theirs = dir_ + "/theirs";
  MakeFile(theirs, 0600);
  ASSERT_EQ(chown(theirs.c_str(), 65534, 65534), 0);
  const std::string err = LogTwoLinesTo(theirs);
  EXPECT_THAT(
      err, HasSubstr(Refused(theirs,
                             "it belongs to uid 65534, not to this process's uid 0 (mode 0600)")));
  EXPECT_EQ(SizeOf(theirs), 0u);
}

// A file of ours that others (or the group) can write: they could add lines
// to it or change them, so it gets none.
TEST_F(LogFileTest, AFileOthersCanWriteIsNotWritten) {
  const struct {
    mode_t mode;
    const char* said;
  } kCases[] = {{0666, "it is writable by its group and others (mode 0666)"},
                {0620, "it is writable by its group (mode 0620)"},
                {0602, "it is writable by others (mode 0602)"}};
  for (const auto& c : kCases) {
    const std::string path = dir_ + "/open-" + std::to_string(c.mode);
    MakeFile(path, c.mode);
    const std::string err = LogTwoLinesTo(path);
    EXPECT_THAT(err, HasSubstr(Refused(path, c.said)));
    EXPECT_EQ(SizeOf(path), 0u);
  }
}

// Our own file, not writable by others (0644 left by an older run, say): used.
TEST_F(LogFileTest, AnExistingFileOfOursIsAppendedTo) {
  const std::string path = dir_ + "/ours.log";
  MakeFile(path, 0644);
  EXPECT_EQ(StderrOfChild([&] {
              SetFile(path);
              VMMIPC_LOG_WARN("into the file");
            }),
            "");
  EXPECT_THAT(Read(path), HasSubstr("] warning: into the file\n"));
}

TEST_F(LogFileTest, ANameLongerThanAPathIsRefusedClearly) {
  SetFile(std::string(5000, 'a'));
  ::testing::internal::CaptureStderr();
  VMMIPC_LOG_WARN("still logged");
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, HasSubstr("cannot use VMMIPC_LOG_FILE: the name is longer than"));
  EXPECT_THAT(err, HasSubstr("still logged"));
}

TEST_F(LogFileTest, LoggingKeepsErrno) {
  SetFile(dir_ + "/errno.log");
  errno = ENOTTY;
  VMMIPC_LOG_INFO("a line");
  EXPECT_EQ(errno, ENOTTY);
}

// With %p a forked child writes its own file (ResetAfterFork reopens); the
// parent's file gets none of the child's lines.
TEST_F(LogFileTest, AForkedChildWritesItsOwnFileWhenTheNameHasPid) {
  SetFile(dir_ + "/v.%p.log");
  VMMIPC_LOG_INFO("parent before fork");
  const pid_t child = RunInChild([] {
    ResetAfterFork();
    VMMIPC_LOG_INFO("child line");
  });
  ASSERT_GT(child, 0);
  VMMIPC_LOG_INFO("parent after fork");
  const std::string parent = Read(dir_ + "/v." + std::to_string(getpid()) + ".log");
  const std::string own = Read(dir_ + "/v." + std::to_string(child) + ".log");
  EXPECT_THAT(parent, HasSubstr("parent before fork"));
  EXPECT_THAT(parent, HasSubstr("parent after fork"));
  EXPECT_THAT(parent, Not(HasSubstr("child line")));
  EXPECT_THAT(own, HasSubstr("[vmmipc pid " + std::to_string(child) + " "));
  EXPECT_THAT(own, HasSubstr("child line"));
  EXPECT_THAT(own, Not(HasSubstr("parent")));
}

// The log registers its own fork handler: a child of a process that never
// made vmmipc's process state (which calls ResetAfterFork too) also gets its file.
TEST_F(LogFileTest, AForkedChildGetsItsOwnFileWithoutBeingToldTo) {
  SetFile(dir_ + "/w.%p.log");
  VMMIPC_LOG_INFO("parent before fork");
  const pid_t child = RunInChild([] { VMMIPC_LOG_INFO("child line"); });
  ASSERT_GT(child, 0);
  EXPECT_THAT(Read(dir_ + "/w." + std::to_string(child) + ".log"), HasSubstr("child line"));
  EXPECT_THAT(Read(dir_ + "/w." + std::to_string(getpid()) + ".log"), Not(HasSubstr("child")));
}

// Without %p parent and child share the file; each line carries its own pid.
TEST_F(LogFileTest, WithoutPidAForkedChildAppendsToTheSameFile) {
  const std::string path = dir_ + "/shared.log";
  SetFile(path);
  VMMIPC_LOG_INFO("parent line");
  const pid_t child = RunInChild([] {
    ResetAfterFork();
    VMMIPC_LOG_INFO("child line");
  });
  ASSERT_GT(child, 0);
  VMMIPC_LOG_INFO("parent again");
  const std::string text = Read(path);
  EXPECT_THAT(text, HasSubstr("[vmmipc pid " + std::to_string(getpid()) +
                              " unranked] info: "
                              "parent line\n"));
  EXPECT_THAT(text, HasSubstr("[vmmipc pid " + std::to_string(child) +
                              " unranked] info: "
                              "child line\n"));
  EXPECT_LT(text.find("child line"), text.find("parent again"));  // appended, not overwritten
}

}  // namespace
}  // namespace vmmipc::log
