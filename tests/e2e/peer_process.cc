// Process plumbing for the end-to-end tests: fork/exec with pipes, bounded waits.
#include "peer_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

extern char** environ;

namespace vmmipc::testing {

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
                                                bool preload) {
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

  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) return nullptr;
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(in[0]);
    close(in[1]);
    return nullptr;
  }
  pid_t pid = fork();
  if (pid == 0) {
    dup2(in[0], STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    char* argv[] = {const_cast<char*>(VMMIPC_PEER_PATH), nullptr};
    execve(VMMIPC_PEER_PATH, argv, envp.data());
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
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
