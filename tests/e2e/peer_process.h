// PeerProcess: the end-to-end tests' handle on one vmmipc_peer process: start
// it with libvmmipc.so preloaded and a chosen environment, send it commands,
// read its one-line answers with a timeout, and end it.
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

class PeerProcess {
 public:
  // `env` is added to the test's own environment (values override).
  static std::unique_ptr<PeerProcess> Start(const std::map<std::string, std::string>& env,
                                            bool preload = true);
  ~PeerProcess();

  // Sends one command line and returns the answer ("" on timeout or exit).
  std::string Call(const std::string& command, int timeout_ms = 20000);
  // Ends the process at once (SIGKILL) and reaps it.
  void Kill();
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
