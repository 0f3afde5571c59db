// Process plumbing for the end-to-end tests: fork/exec with pipes, bounded
// waits, and the pid namespaces some peers run in.
#include "peer_process.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

// Older headers lack them; the numbers are the same on every architecture.
#ifndef SYS_clone3
#define SYS_clone3 435
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif

extern char** environ;

namespace vmmipc::testing {
namespace {

// clone3's argument up to set_tid (CLONE_ARGS_SIZE_VER1), declared here:
// older kernel headers lack struct clone_args or its set_tid.
struct CloneArgs {
  uint64_t flags = 0, pidfd = 0, child_tid = 0, parent_tid = 0, exit_signal = 0, stack = 0,
           stack_size = 0, tls = 0, set_tid = 0, set_tid_size = 0;
};

std::string ErrnoText(int error) { return std::string(std::strerror(error)); }

// The pid PidNamespace::Create gives a process that exits at once, to learn
// whether pids can be chosen there; free again when the test's peers start.
constexpr pid_t kProbedPid = 2;

// Two CLOEXEC pipes, or neither (and why).
bool TwoPipes(int first[2], int second[2], std::string* why) {
  if (pipe2(first, O_CLOEXEC) != 0) {
    *why = "pipe: " + ErrnoText(errno);
    return false;
  }
  if (pipe2(second, O_CLOEXEC) != 0) {
    *why = "pipe: " + ErrnoText(errno);
    close(first[0]);
    close(first[1]);
    return false;
  }
  return true;
}

// Reads exactly `size` bytes, or fewer when the writer went away first.
size_t ReadFully(int fd, void* data, size_t size) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = read(fd, static_cast<char*>(data) + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

// In a forked child (system calls only: the test may have threads): writes
// `text` to `path` in one write, as /proc's map files want it.
bool WriteProcFile(const char* path, const char* text, size_t length) {
  const int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool written = write(fd, text, length) == static_cast<ssize_t>(length);
  const int error = errno;
  close(fd);
  errno = error;
  return written;
}

}  // namespace

namespace {

// The uid and gid maps of PeerPlacement::user_namespace_uid: the test's ids
// as `inside`. Written by the child itself (an unprivileged process may map
// its own ids, once setgroups is denied). Made before the fork: a forked
// child of a threaded test may only make system calls.
struct UserNamespaceMaps {
  explicit UserNamespaceMaps(int inside)
      : uid_map(std::to_string(inside) + " " + std::to_string(geteuid()) + " 1\n"),
        gid_map(std::to_string(inside) + " " + std::to_string(getegid()) + " 1\n") {}
  std::string uid_map, gid_map;
};

// In a forked child: a user namespace of its own with `maps`; errno on failure.
int EnterUserNamespace(const UserNamespaceMaps& maps) {
  if (unshare(CLONE_NEWUSER) != 0) return errno;
  if (!WriteProcFile("/proc/self/setgroups", "deny", 4) && errno != ENOENT) return errno;
  if (!WriteProcFile("/proc/self/uid_map", maps.uid_map.data(), maps.uid_map.size())) return errno;
  if (!WriteProcFile("/proc/self/gid_map", maps.gid_map.data(), maps.gid_map.size())) return errno;
  return 0;
}

// Whether `attempt` (returning 0 or an errno) succeeds in a forked child,
// which then exits; if not, `what` and the errno in *why.
template <typename Attempt>
bool WorksInAChild(Attempt attempt, const char* what, std::string* why) {
  const pid_t child = fork();
  if (child == 0) _exit(attempt() & 0x7f);
  int status = 0;
  if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status)) {
    *why = "fork or wait failed";
    return false;
  }
  if (WEXITSTATUS(status) == 0) return true;
  *why = std::string(what) + ": " + ErrnoText(WEXITSTATUS(status));
  return false;
}

}  // namespace

bool CanMakeNetworkNamespace(std::string* why) {
  return WorksInAChild([] { return unshare(CLONE_NEWNET) == 0 ? 0 : errno; },
                       "unshare(CLONE_NEWNET)", why);
}

bool CanMakeUserNamespace(std::string* why) {
  const UserNamespaceMaps maps(0);
  return WorksInAChild([&maps] { return EnterUserNamespace(maps); },
                       "unshare(CLONE_NEWUSER) and its uid map", why);
}

namespace {

// The forked child becomes the peer: its stdin and stdout are the pipes.
[[noreturn]] void ExecPeer(int in, int out, char* const* envp) {
  dup2(in, STDIN_FILENO);
  dup2(out, STDOUT_FILENO);
  char* argv[] = {const_cast<char*>(VMMIPC_PEER_PATH), nullptr};
  execve(VMMIPC_PEER_PATH, argv, envp);
  _exit(127);
}

// Starts the peer in `placement`'s pid namespace. A forked child joins the
// namespace (its user namespace first, when it has one of its own), which
// places the children it makes from then on, not itself; makes the peer,
// with the chosen pid through clone3's set_tid (which needs
// CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN where the namespace was made: the
// test has them there); and exits. The peer, orphaned, goes to the test (a
// child subreaper since PidNamespace::Create), which waits for it as for any
// child. Returns its pid as
// the test sees it, or -1 with the reason in *why.
pid_t SpawnIn(const PeerPlacement& placement, int in, int out, char* const* envp,
              std::string* why) {
  const std::string ns = "/proc/" + std::to_string(placement.pid_namespace->holder()) + "/ns/";
  const int user_ns = placement.pid_namespace->own_user_namespace()
                          ? open((ns + "user").c_str(), O_RDONLY | O_CLOEXEC)
                          : -1;
  const int pid_ns = open((ns + "pid").c_str(), O_RDONLY | O_CLOEXEC);
  int report[2] = {-1, -1};
  if (pid_ns < 0 || (placement.pid_namespace->own_user_namespace() && user_ns < 0) ||
      pipe2(report, O_CLOEXEC) != 0) {
    *why = "cannot open " + ns + ": " + ErrnoText(errno);
    if (user_ns >= 0) close(user_ns);
    if (pid_ns >= 0) close(pid_ns);
    return -1;
  }
  CloneArgs args;
  args.exit_signal = SIGCHLD;
  pid_t chosen = placement.pid;
  if (chosen != 0) {
    args.set_tid = reinterpret_cast<uintptr_t>(&chosen);
    args.set_tid_size = 1;  // its pid in the innermost namespace, the one joined
  }
  const pid_t middle = fork();
  const int fork_error = errno;
  if (middle == 0) {
    // Answers (0, the peer's pid) or (the step that failed, its errno).
    auto answer = [&](int step, int value) {
      const int words[2] = {step, value};
      (void)!write(report[1], words, sizeof(words));
      _exit(0);
    };
    if (user_ns >= 0 && setns(user_ns, CLONE_NEWUSER) != 0) answer(1, errno);
    if (setns(pid_ns, CLONE_NEWPID) != 0) answer(2, errno);
    const long peer = chosen != 0 ? syscall(SYS_clone3, &args, sizeof(args)) : fork();
    if (peer == 0) {
      // A /proc of the namespace's own, as a container runtime mounts one: the
      // real driver's cuInit fails (304) where /proc is the parent's
      // (docs/driver-behaviour.md#namespaces). In a mount namespace of the
      // peer's, made private first so that nothing propagates to the test's.
      // Where that is refused the peer runs with the parent's /proc.
      if (unshare(CLONE_NEWNS) == 0 &&
          mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0)
        (void)mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
      ExecPeer(in, out, envp);
    }
    if (peer < 0) answer(3, errno);
    answer(0, static_cast<int>(peer));
  }
  close(report[1]);
  if (user_ns >= 0) close(user_ns);
  close(pid_ns);
  int words[2] = {-1, 0};
  const size_t got = middle > 0 ? ReadFully(report[0], words, sizeof(words)) : 0;
  close(report[0]);
  if (middle < 0) {
    *why = "fork: " + ErrnoText(fork_error);
    return -1;
  }
  waitpid(middle, nullptr, 0);
  if (got == sizeof(words) && words[0] == 0) return words[1];
  const char* const steps[] = {"setns(CLONE_NEWUSER)", "setns(CLONE_NEWPID)",
                               chosen != 0 ? "clone3 with set_tid" : "fork"};
  if (got != sizeof(words) || words[0] < 1 || words[0] > 3)
    *why = "the child that joins the namespace died";
  else
    *why = std::string(steps[words[0] - 1]) + ": " + ErrnoText(words[1]);
  return -1;
}

}  // namespace

std::unique_ptr<PidNamespace> PidNamespace::Create(std::string* why) {
  // Made before the fork: a forked child of a threaded test may only make
  // system calls.
  const std::string uid_map = std::to_string(geteuid()) + " " + std::to_string(geteuid()) + " 1\n";
  const std::string gid_map = std::to_string(getegid()) + " " + std::to_string(getegid()) + " 1\n";
  const long max_fd = sysconf(_SC_OPEN_MAX);
  int hold[2], report[2];
  if (!TwoPipes(hold, report, why)) return nullptr;
  // The holder is orphaned when the child that made it exits, and so is every
  // peer started in the namespace (SpawnIn): they come to the test, which
  // waits for them as for its own children.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  const pid_t launcher = fork();
  if (launcher == 0) {
    // errno of unshare(CLONE_NEWPID); of the user-namespace way and its
    // step; the holder's pid (the launcher stays outside: fork answers the
    // test's view of it); errno of a process made there with a chosen pid.
    int words[5] = {0, 0, 0, 0, 0};
    auto answer = [&] {
      (void)!write(report[1], words, sizeof(words));
      _exit(0);
    };
    auto failed = [&](int step) {
      words[1] = errno;
      words[2] = step;
      answer();
    };
    if (unshare(CLONE_NEWPID) != 0) {
      words[0] = errno;
      if (unshare(CLONE_NEWUSER | CLONE_NEWPID) != 0) failed(1);
      // setgroups first: an unprivileged process may not write gid_map until it is denied.
      if (!WriteProcFile("/proc/self/setgroups", "deny", 4) && errno != ENOENT) failed(2);
      if (!WriteProcFile("/proc/self/uid_map", uid_map.data(), uid_map.size())) failed(3);
      if (!WriteProcFile("/proc/self/gid_map", gid_map.data(), gid_map.size())) failed(4);
    }
    const pid_t holder = fork();
    if (holder == 0) {
      // Pid 1 of the namespace, until the test closes the pipe. It keeps
      // nothing else open: a copy of a peer's pipe here would keep that peer
      // from ever reading its end.
      dup2(hold[0], STDIN_FILENO);
      if (syscall(SYS_close_range, 1, ~0u, 0) != 0)
        for (long fd = 1; fd < max_fd && fd < 65536; ++fd) close(static_cast<int>(fd));
      for (char c;;) {
        const ssize_t n = read(STDIN_FILENO, &c, 1);
        if (n == 0 || (n < 0 && errno != EINTR)) _exit(0);
      }
    }
    if (holder < 0) failed(5);
    words[3] = holder;
    // Whether peers can be given a pid there (clone3's set_tid: Linux 5.5,
    // and no seccomp filter that refuses clone3), tried once with a process
    // that exits at once.
    pid_t probe_pid = kProbedPid;
    CloneArgs args;
    args.exit_signal = SIGCHLD;
    args.set_tid = reinterpret_cast<uintptr_t>(&probe_pid);
    args.set_tid_size = 1;
    const long probe = syscall(SYS_clone3, &args, sizeof(args));
    if (probe == 0) _exit(0);
    if (probe < 0) words[4] = errno;
    if (probe > 0) waitpid(static_cast<pid_t>(probe), nullptr, 0);
    answer();
  }
  const int fork_error = errno;
  close(hold[0]);
  close(report[1]);
  int words[5] = {0, 0, 0, 0, 0};
  const size_t got = launcher > 0 ? ReadFully(report[0], words, sizeof(words)) : 0;
  close(report[0]);
  if (launcher > 0) waitpid(launcher, nullptr, 0);
  if (got != sizeof(words) || words[3] <= 0) {
    const char* const steps[] = {"unshare(CLONE_NEWUSER | CLONE_NEWPID)",
                                 "writing /proc/self/setgroups", "writing /proc/self/uid_map",
                                 "writing /proc/self/gid_map", "fork"};
    if (launcher < 0)
      *why = "fork: " + ErrnoText(fork_error);
    else if (got != sizeof(words) || words[2] < 1 || words[2] > 5)
      *why = "the child that makes the namespace died";
    else
      *why = "unshare(CLONE_NEWPID): " + ErrnoText(words[0]) + "; " + steps[words[2] - 1] + ": " +
             ErrnoText(words[1]);
    close(hold[1]);
    return nullptr;
  }
  std::unique_ptr<PidNamespace> created(new PidNamespace());
  created->holder_ = words[3];
  created->hold_ = hold[1];
  created->own_user_namespace_ = words[0] != 0;
  if (words[4] != 0)
    created->why_no_chosen_pids_ =
        "clone3 with set_tid (pid " + std::to_string(kProbedPid) + "): " + ErrnoText(words[4]);
  return created;
}

bool PidNamespace::ChoosesPids(std::string* why) const {
  *why = why_no_chosen_pids_;
  return why_no_chosen_pids_.empty();
}

PidNamespace::~PidNamespace() {
  close(hold_);  // the holder reads EOF and exits: the kernel ends whatever is left inside
  waitpid(holder_, nullptr, 0);
}

DriverKind DriverUnderTest() {
  const char* kind = std::getenv("E2E_DRIVER");
  return kind != nullptr && std::strcmp(kind, "gpu") == 0 ? DriverKind::kReal
                                                          : DriverKind::kSimulated;
}

bool DriverAvailable(std::string* why) {
  if (DriverUnderTest() == DriverKind::kSimulated) return true;
  std::string command = std::string(VMMIPC_PEER_PATH) + " probe";
  int status = std::system(command.c_str());
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  *why = "no CUDA device (vmmipc_peer probe found none)";
  return false;
}

std::unique_ptr<PeerProcess> PeerProcess::Start(const std::map<std::string, std::string>& env,
                                                bool preload, const PeerPlacement& placement,
                                                std::string* why) {
  std::map<std::string, std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    size_t eq = entry.find('=');
    if (eq != std::string::npos) vars[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  vars.erase("LD_PRELOAD");
  if (preload) vars["LD_PRELOAD"] = VMMIPC_LIBRARY_PATH;
  if (DriverUnderTest() == DriverKind::kSimulated) vars["LD_LIBRARY_PATH"] = VMMIPC_SIM_DIR;
  if (vars.find("VMMIPC_LOG_LEVEL") == vars.end()) vars["VMMIPC_LOG_LEVEL"] = "info";
  for (const auto& [key, value] : env) {
    if (value == kUnset)
      vars.erase(key);
    else
      vars[key] = value;
  }
  std::vector<std::string> strings;
  for (const auto& [key, value] : vars) strings.push_back(key + "=" + value);
  std::vector<char*> envp;
  for (auto& s : strings) envp.push_back(s.data());
  envp.push_back(nullptr);

  std::string ignored;
  if (why == nullptr) why = &ignored;
  int in[2], out[2];
  if (!TwoPipes(in, out, why)) return nullptr;
  pid_t pid = -1;
  const UserNamespaceMaps maps(std::max(placement.user_namespace_uid, 0));
  if (placement.pid_namespace != nullptr) {
    pid = SpawnIn(placement, in[0], out[1], envp.data(), why);
  } else if ((pid = fork()) == 0) {
    // The child's own user, network and IPC namespaces, its uid: a failure is
    // the peer's exit 123 to 126, which the test sees as a peer that does not
    // answer.
    if (placement.user_namespace_uid >= 0 && EnterUserNamespace(maps) != 0) _exit(125);
    if (placement.unmapped_user_namespace && unshare(CLONE_NEWUSER) != 0) _exit(125);
    if (placement.own_network_namespace && unshare(CLONE_NEWNET) != 0) _exit(126);
    if (placement.own_ipc_namespace && unshare(CLONE_NEWIPC) != 0) _exit(124);
    if (placement.uid >= 0 && (setgroups(0, nullptr) != 0 ||
                               setresgid(placement.uid, placement.uid, placement.uid) != 0 ||
                               setresuid(placement.uid, placement.uid, placement.uid) != 0))
      _exit(123);
    ExecPeer(in[0], out[1], envp.data());
  } else if (pid < 0) {
    *why = "fork: " + ErrnoText(errno);
  }
  close(in[0]);
  close(out[1]);
  if (pid < 0) {
    close(in[1]);
    close(out[0]);
    return nullptr;
  }
  std::unique_ptr<PeerProcess> peer(new PeerProcess());
  peer->pid_ = pid;
  peer->to_child_ = in[1];
  peer->from_child_ = out[0];
  return peer;
}

PeerProcess::~PeerProcess() {
  if (pid_ > 0) {
    (void)!write(to_child_, "exit\n", 5);
    for (int i = 0; i < 200; ++i) {  // up to 2 s for a clean exit, then kill
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      usleep(10000);
    }
    if (pid_ > 0) Kill();
  }
  if (to_child_ >= 0) close(to_child_);
  if (from_child_ >= 0) close(from_child_);
}

void PeerProcess::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

std::string PeerProcess::Call(const std::string& command, int timeout_ms) {
  std::string line = command + "\n";
  if (write(to_child_, line.data(), line.size()) != static_cast<ssize_t>(line.size())) return "";
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    size_t newline = buffered_.find('\n');
    if (newline != std::string::npos) {
      std::string answer = buffered_.substr(0, newline);
      buffered_.erase(0, newline + 1);
      return answer;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) return "";
    pollfd p = {from_child_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    char buf[4096];
    ssize_t n = read(from_child_, buf, sizeof(buf));
    if (n <= 0) return "";
    buffered_.append(buf, static_cast<size_t>(n));
  }
}

std::string Value(const std::string& answer) {
  return answer.rfind("ok ", 0) == 0 ? answer.substr(3) : "";
}

}  // namespace vmmipc::testing
