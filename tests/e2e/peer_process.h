// PeerProcess: the end-to-end tests' handle on one vmmipc_peer process: start
// it with libvmmipc.so preloaded and a chosen environment (and, for the
// follow and container tests, in a pid namespace of the test's, with a chosen
// pid there, or in a user or network namespace of its own),
// send it commands, read its one-line answers with a timeout, and end it.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>

namespace vmmipc::testing {

// Which driver the peers run on: the simulated one (CI) or the real one.
enum class DriverKind { kSimulated, kReal };
DriverKind DriverUnderTest();
// True when peers can run here: the simulated driver always can; the real
// one needs a GPU (vmmipc_peer probe).
bool DriverAvailable(std::string* why);

// An `env` value that removes the variable instead of setting it.
inline constexpr const char* kUnset = "\x01unset";

// A pid namespace of the test's own, for peers that must see other processes
// under other pids than the test does: one inside it sees every process
// outside as pid 0 (SO_PEERCRED), and peers started in it can be given the
// pid a gone one had (pid reuse, staged). Made by unshare(CLONE_NEWPID),
// which needs CAP_SYS_ADMIN, else with a user namespace of its own around it
// (CLONE_NEWUSER, the test's uid and gid mapped to themselves, so sockets
// and SO_PEERCRED uids read the same inside and out). Its init is a holder
// process that waits for this object to go; when it goes, the kernel ends
// every process left in the namespace.
class PidNamespace {
 public:
  // Null, with the errno of each unshare in *why, when neither works here.
  static std::unique_ptr<PidNamespace> Create(std::string* why);
  ~PidNamespace();
  PidNamespace(const PidNamespace&) = delete;
  PidNamespace& operator=(const PidNamespace&) = delete;

  pid_t holder() const { return holder_; }  // its init, under the test's pid
  bool own_user_namespace() const { return own_user_namespace_; }
  // Whether a peer can be started there with a chosen pid (PeerPlacement::pid);
  // if not, why (the errno of clone3 with set_tid: a kernel before 5.5, a
  // seccomp filter that refuses clone3).
  bool ChoosesPids(std::string* why) const;

 private:
  PidNamespace() = default;
  pid_t holder_ = -1;
  int hold_ = -1;  // the write end of the pipe the holder reads until EOF
  bool own_user_namespace_ = false;
  std::string why_no_chosen_pids_;  // empty when pids can be chosen
};

// Where a peer runs: by default where the test runs.
struct PeerPlacement {
  const PidNamespace* pid_namespace = nullptr;
  pid_t pid = 0;  // its pid in `pid_namespace` (clone3's set_tid); 0: the kernel's next one
  // A network namespace of its own (unshare(CLONE_NEWNET) before exec; not with
  // pid_namespace): no abstract socket of the test's namespace reaches it.
  bool own_network_namespace = false;
  // >= 0: a user namespace of its own (unshare(CLONE_NEWUSER) before exec, and
  // before the network namespace when both), in which the test's uid and gid
  // read as this number: a rootless container's process, which is uid 0 to
  // itself (`unshare --user --map-root-user`) and the test's uid to the host.
  // Not with pid_namespace.
  int user_namespace_uid = -1;
  // A user namespace of its own with no uid or gid map (`unshare --user`):
  // its uid is the overflow uid, and so is every other user's to it. Not
  // with pid_namespace or user_namespace_uid. (It cannot create files: the
  // test makes its log file first.)
  bool unmapped_user_namespace = false;
  // An IPC namespace of its own (unshare(CLONE_NEWIPC): docker's default
  // --ipc=private). Not with pid_namespace.
  bool own_ipc_namespace = false;
  // >= 0: the peer runs as this uid and gid (setresuid before exec; the test
  // must be root). Not with pid_namespace or user_namespace_uid.
  int uid = -1;
};

// Whether this process may make a user namespace (tried in a child, as
// PeerPlacement::user_namespace_uid does); if not, why.
bool CanMakeUserNamespace(std::string* why);

// Whether this process may make a network namespace (tried in a child);
// if not, why.
bool CanMakeNetworkNamespace(std::string* why);

class PeerProcess {
 public:
  // `env` is added to the test's own environment (values override). Null
  // when the process cannot be started, with the reason in *why if given (a
  // placement the kernel refuses: setns, clone3).
  static std::unique_ptr<PeerProcess> Start(const std::map<std::string, std::string>& env,
                                            bool preload = true,
                                            const PeerPlacement& placement = {},
                                            std::string* why = nullptr);
  ~PeerProcess();

  // Sends one command line and returns the answer ("" on timeout or exit).
  std::string Call(const std::string& command, int timeout_ms = 20000);
  // Ends the process at once (SIGKILL) and reaps it.
  void Kill();
  // Its pid as the test sees it (in a pid namespace of the test's it has
  // another one there: ask it, `pid`).
  pid_t pid() const { return pid_; }

 private:
  PeerProcess() = default;
  pid_t pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
  std::string buffered_;
};

// "ok 0x1234" -> "0x1234"; anything else -> "" (and the test sees the answer).
std::string Value(const std::string& answer);

}  // namespace vmmipc::testing
