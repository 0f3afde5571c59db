// The exporter process of vmmipc_bench and the importer's client for it.
// Every wait of the client is bounded; the exporter dies with its parent
// (PR_SET_PDEATHSIG) and exits on end of stream, so it never outlives a run.
// The exporter is single-threaded: one poll loop serves the channel and the
// floor socket, so the floor's export state needs no lock.
#include "exporter.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "bench_common.h"

namespace vmmipc_bench {
namespace {

constexpr int kChannelFd = 3;  // the exporter's end of the socketpair

std::atomic<pid_t> g_exporter_pids[2] = {-1, -1};  // main exporter, floor exporter
std::atomic<pid_t> g_transient_pid{-1};

std::string ErrnoText(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

void SetText(Reply* reply, const std::string& text) {
  std::snprintf(reply->text, sizeof(reply->text), "%s", text.c_str());
}

void CloseAll(std::vector<int>* fds) {
  for (int fd : *fds) close(fd);
  fds->clear();
}

// ---- the exporter process ------------------------------------------------------------------

class Exporter {
 public:
  explicit Exporter(CUdevice device) : device_(device) {}

  void Handle(const Request& request, Reply* reply, std::vector<int>* fds) {
    reply->op = request.op;
    switch (static_cast<Op>(request.op)) {
      case Op::kPing:
        return;
      case Op::kAlloc:
        return Alloc(request, reply);
      case Op::kFree:
        return Free(request, reply);
      case Op::kGet:
        return Get(request, reply);
      case Op::kFloorStart:
        return FloorStart(reply);
      case Op::kDropExports:
        reply->value[0] = DropExports();
        return;
      case Op::kCopy:
        return Copy(request, reply);
      case Op::kProbeStart:
        return ProbeStart(reply);
      default:
        reply->status = kNotCuda;
        SetText(reply, "unknown request " + std::to_string(request.op));
    }
  }

  int floor_fd() const { return floor_fd_; }

  // One connection, one request, one reply with the fds; then the exporter closes its
  // copies (timed, reported with the next request) and the connection.
  void ServeFloor() {
    const int c = accept4(floor_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;
    Request request;
    Reply reply;
    std::string error;
    if (ReceiveMessage(c, &request, sizeof(request), nullptr, 5000, &error)) {
      std::vector<int> fds;
      reply.op = request.op;
      FloorExport(request, &reply, &fds);
      SendMessage(c, &reply, sizeof(reply), fds.data(), static_cast<int>(fds.size()), &error);
      const int64_t t0 = NowNs();
      CloseAll(&fds);
      last_close_us_ = static_cast<double>(NowNs() - t0) / 1e3;
    }
    close(c);
  }

 private:
  OwnedBuffer* Find(uint32_t id, Reply* reply) {
    auto it = buffers_.find(id);
    if (it != buffers_.end()) return &it->second;
    reply->status = kNotCuda;
    SetText(reply, "no buffer " + std::to_string(id));
    return nullptr;
  }

  void Fail(Reply* reply, CUresult r, const std::string& what) {
    reply->status = static_cast<int32_t>(r);
    SetText(reply, "exporter: " + CuFailure(r, what));
  }

  void Alloc(const Request& request, Reply* reply) {
    const auto& layouts = Layouts();
    if (request.arg[0] >= layouts.size()) {
      reply->status = kNotCuda;
      SetText(reply, "no layout " + std::to_string(request.arg[0]));
      return;
    }
    OwnedBuffer b;
    std::string error;
    if (!AllocBuffer(layouts[request.arg[0]], request.arg[1] != 0, device_, &b, &error)) {
      reply->status = kNotCuda;
      SetText(reply, "exporter: " + error);
      return;
    }
    const uint32_t id = next_id_++;
    const unsigned char tag = static_cast<unsigned char>(0x40 + id);
    // The importer checks the tag through its mapping: the end of the last chunk.
    CUresult r = cuMemsetD8(b.base + b.total - kTagBytes, tag, kTagBytes);
    if (r == CUDA_SUCCESS) r = cuCtxSynchronize();
    if (r != CUDA_SUCCESS) {
      FreeBuffer(&b);
      return Fail(reply, r, "cuMemsetD8 of the tag");
    }
    buffers_[id] = b;
    reply->value[0] = id;
    reply->value[1] = b.base;
    reply->value[2] = tag;
  }

  void Get(const Request& request, Reply* reply) {
    OwnedBuffer* b = Find(request.id, reply);
    if (b == nullptr) return;
    CUipcMemHandle handle;
    const int64_t t0 = NowNs();
    const CUresult r = cuIpcGetMemHandle(&handle, b->base);  // vmmipc's hook when preloaded
    reply->us[0] = static_cast<double>(NowNs() - t0) / 1e3;
    if (r != CUDA_SUCCESS) return Fail(reply, r, "cuIpcGetMemHandle");
    std::memcpy(reply->handle, handle.reserved, CU_IPC_HANDLE_SIZE);
  }

  void Free(const Request& request, Reply* reply) {
    OwnedBuffer* b = Find(request.id, reply);
    if (b == nullptr) return;
    auto kept = kept_.find(request.id);
    if (kept != kept_.end()) {
      CloseAll(&kept->second);
      kept_.erase(kept);
    }
    FreeBuffer(b);
    buffers_.erase(request.id);
  }

  // ---- the floor ----

  void FloorStart(Reply* reply) {
    if (floor_fd_ < 0) {
      const std::string name =
          "vmmipc_bench.floor." + std::to_string(getuid()) + "." + std::to_string(getpid());
      // SOCK_SEQPACKET, as vmmipc's own listener.
      const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
      sockaddr_un addr = {};
      addr.sun_family = AF_UNIX;
      std::memcpy(addr.sun_path + 1, name.data(), name.size());
      const socklen_t len =
          static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
      if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, 16) != 0) {
        reply->status = kNotCuda;
        SetText(reply, ErrnoText("exporter: floor socket"));
        if (fd >= 0) close(fd);
        return;
      }
      floor_fd_ = fd;
      floor_name_ = name;
    }
    SetText(reply, floor_name_);
  }

  // Closes every exported fd this exporter keeps: afterwards none of its exports is alive
  // (fds it sent are closed right after sending). Returns how many it closed.
  uint64_t DropExports() {
    uint64_t n = anchor_fd_ >= 0 ? 1 : 0;
    if (anchor_fd_ >= 0) close(anchor_fd_);
    anchor_fd_ = -1;
    for (auto& [id, fds] : kept_) {
      n += fds.size();
      CloseAll(&fds);
    }
    kept_.clear();
    return n;
  }

  // One fd per chunk of `b`, freshly exported.
  bool ExportAll(const OwnedBuffer& b, std::vector<int>* fds, Reply* reply) {
    for (CUmemGenericAllocationHandle h : b.handles) {
      int fd = -1;
      const CUresult r =
          Real().export_shareable(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      if (r != CUDA_SUCCESS) {
        CloseAll(fds);
        Fail(reply, r, "cuMemExportToShareableHandle(POSIX fd)");
        return false;
      }
      fds->push_back(fd);
    }
    return true;
  }

  // The anchor of kFloorFresh: one exported fd of a buffer of its own, kept alive.
  bool EnsureAnchor(Reply* reply) {
    if (anchor_fd_ >= 0) return true;
    std::string error;
    if (anchor_.base == 0 && !AllocBuffer(Layouts()[0], true, device_, &anchor_, &error)) {
      reply->status = kNotCuda;
      SetText(reply, "exporter: anchor buffer: " + error);
      return false;
    }
    std::vector<int> fds;
    if (!ExportAll(anchor_, &fds, reply)) return false;
    anchor_fd_ = fds[0];
    return true;
  }

  void FloorExport(const Request& request, Reply* reply, std::vector<int>* fds) {
    reply->us[1] = last_close_us_;
    OwnedBuffer* b = Find(request.id, reply);
    if (b == nullptr) return;
    if (!b->vmm || b->handles.size() > static_cast<size_t>(kMaxFds)) {
      reply->status = kNotCuda;
      SetText(reply, "exporter: buffer is not VMM or has too many chunks for one message");
      return;
    }
    const Op op = static_cast<Op>(request.op);
    // State first, untimed: what must (not) be alive when the export starts.
    if (op == Op::kFloorFresh && !EnsureAnchor(reply)) return;
    if (op == Op::kFloorCliff) DropExports();
    const int64_t t0 = NowNs();
    if (op == Op::kFloorDup) {
      std::vector<int>& kept = kept_[request.id];
      if (kept.empty() && !ExportAll(*b, &kept, reply)) return;
      for (int fd : kept) {
        const int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (copy < 0) {
          CloseAll(fds);
          reply->status = kNotCuda;
          SetText(reply, ErrnoText("exporter: dup of a kept fd"));
          return;
        }
        fds->push_back(copy);
      }
    } else if (op == Op::kFloorFresh || op == Op::kFloorCliff) {
      if (!ExportAll(*b, fds, reply)) return;
    } else {
      reply->status = kNotCuda;
      SetText(reply, "exporter: not a floor request: " + std::to_string(request.op));
      return;
    }
    reply->us[0] = static_cast<double>(NowNs() - t0) / 1e3;
  }

  void Copy(const Request& request, Reply* reply) {
    OwnedBuffer* b = Find(request.id, reply);
    if (b == nullptr) return;
    CUresult r;
    if (scratch_size_ < b->total) {
      if (scratch_ != 0) cuMemFree(scratch_);
      scratch_ = 0;
      scratch_size_ = 0;
      if ((r = cuMemAlloc(&scratch_, b->total)) != CUDA_SUCCESS)
        return Fail(reply, r, "cuMemAlloc of the copy destination");
      scratch_size_ = b->total;
    }
    const int64_t t0 = NowNs();
    r = cuMemcpyDtoD(scratch_, b->base, b->total);
    if (r == CUDA_SUCCESS) r = cuCtxSynchronize();
    reply->us[0] = static_cast<double>(NowNs() - t0) / 1e3;
    if (r != CUDA_SUCCESS) return Fail(reply, r, "cuMemcpyDtoD + cuCtxSynchronize");
  }

  // An abstract socket that accepts, echoes one byte and closes: the cost of a
  // connection to another process, as vmmipc's importer makes one per fetch.
  void ProbeStart(Reply* reply) {
    if (probe_name_.empty()) {
      const std::string name =
          "vmmipc_bench." + std::to_string(getuid()) + "." + std::to_string(getpid());
      int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_un addr = {};
      addr.sun_family = AF_UNIX;
      std::memcpy(addr.sun_path + 1, name.data(), name.size());
      const socklen_t len =
          static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
      if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
          listen(fd, 128) != 0) {
        reply->status = kNotCuda;
        SetText(reply, ErrnoText("exporter: probe socket"));
        if (fd >= 0) close(fd);
        return;
      }
      std::thread([fd] {
        for (;;) {
          const int c = accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
          if (c < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            return;
          }
          char byte = 0;
          if (read(c, &byte, 1) == 1) (void)!write(c, &byte, 1);
          close(c);
        }
      }).detach();
      probe_name_ = name;
    }
    SetText(reply, probe_name_);
  }

  CUdevice device_;
  uint32_t next_id_ = 1;
  std::map<uint32_t, OwnedBuffer> buffers_;
  // The floor's export state: kept fds per buffer id (kFloorDup), the anchor (kFloorFresh).
  int floor_fd_ = -1;
  std::string floor_name_;
  std::map<uint32_t, std::vector<int>> kept_;
  OwnedBuffer anchor_;
  int anchor_fd_ = -1;
  double last_close_us_ = 0;
  CUdeviceptr scratch_ = 0;
  uint64_t scratch_size_ = 0;
  std::string probe_name_;
};

bool ParseIntFlag(const char* arg, const char* name, long* value) {
  const size_t n = std::strlen(name);
  if (std::strncmp(arg, name, n) != 0 || arg[n] != '=') return false;
  *value = std::strtol(arg + n + 1, nullptr, 10);
  return true;
}

int WaitPidBounded(pid_t pid, int timeout_ms) {
  for (int waited = 0;; waited += 10) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) return -1;
    if (waited >= timeout_ms) return -2;
    usleep(10000);
  }
}

}  // namespace

// ---- message helpers -----------------------------------------------------------------------

bool SendMessage(int fd, const void* data, size_t size, const int* fds, int fd_count,
                 std::string* error) {
  alignas(cmsghdr) static thread_local char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
  iovec iov = {const_cast<void*>(data), size};
  msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (fd_count > kMaxFds) {
    *error = "too many fds for one message";
    return false;
  }
  if (fd_count > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fd_count);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fd_count);
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * fd_count);
  }
  ssize_t n;
  do {
    n = sendmsg(fd, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(size)) {
    *error = n < 0 ? ErrnoText("sendmsg") : "sendmsg: short message";
    return false;
  }
  return true;
}

bool ReceiveMessage(int fd, void* data, size_t size, std::vector<int>* fds, int timeout_ms,
                    std::string* error) {
  const int64_t deadline = NowNs() + static_cast<int64_t>(timeout_ms) * 1000000;
  for (;;) {
    int wait_ms = -1;
    if (timeout_ms >= 0) {
      const int64_t left = deadline - NowNs();
      if (left <= 0) {
        *error = "no reply within " + std::to_string(timeout_ms) + " ms";
        return false;
      }
      wait_ms = static_cast<int>((left + 999999) / 1000000);
    }
    pollfd p = {fd, POLLIN, 0};
    const int r = poll(&p, 1, wait_ms);
    if (r > 0) break;
    if (r < 0 && errno != EINTR) {
      *error = ErrnoText("poll");
      return false;
    }
  }
  alignas(cmsghdr) static thread_local char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
  iovec iov = {data, size};
  msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    *error = ErrnoText("recvmsg");
    return false;
  }
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int received;
      std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (fds != nullptr) {
        fds->push_back(received);
      } else {
        close(received);
      }
    }
  }
  if (n == 0) {
    error->clear();  // end of stream
    return false;
  }
  if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 || static_cast<size_t>(n) != size) {
    if (fds != nullptr) CloseAll(fds);
    *error = "malformed message (" + std::to_string(n) + " bytes, flags " +
             std::to_string(msg.msg_flags) + ")";
    return false;
  }
  return true;
}

// ---- the exporter's main -------------------------------------------------------------------

int ExporterMain(int argc, char** argv) {
  long device_ordinal = 0, parent = 0;
  for (int i = 1; i < argc; ++i) {
    ParseIntFlag(argv[i], "--vmmipc_device", &device_ordinal);
    ParseIntFlag(argv[i], "--vmmipc_parent", &parent);
  }
  // Die with the benchmark process, even inside a hung driver call.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (parent != 0 && getppid() != static_cast<pid_t>(parent)) return 1;

  Reply ready;
  ready.op = static_cast<uint32_t>(Op::kReady);
  std::string error;
  CUdevice device = 0;
  CUcontext context = nullptr;
  CUresult r = CUDA_SUCCESS;
  RealDriver real;
  if (!LoadRealDriver(&real, &error)) {
    ready.status = kNotCuda;
    SetText(&ready, "exporter: " + error);
  } else if ((r = cuInit(0)) != CUDA_SUCCESS ||
             (r = cuDeviceGet(&device, static_cast<int>(device_ordinal))) != CUDA_SUCCESS ||
             (r = cuDevicePrimaryCtxRetain(&context, device)) != CUDA_SUCCESS ||
             (r = cuCtxSetCurrent(context)) != CUDA_SUCCESS) {
    ready.status = static_cast<int32_t>(r);
    SetText(&ready, "exporter: " + CuFailure(r, "cuInit / cuDeviceGet / primary context"));
  } else {
    char name[200] = {};
    if (cuDeviceGetName(name, sizeof(name), device) != CUDA_SUCCESS) std::strcpy(name, "?");
    SetText(&ready, name);
  }
  if (!SendMessage(kChannelFd, &ready, sizeof(ready), nullptr, 0, &error)) return 1;
  if (ready.status != CUDA_SUCCESS) return 1;

  Exporter exporter(device);
  for (;;) {
    pollfd p[2] = {{kChannelFd, POLLIN, 0}, {exporter.floor_fd(), POLLIN, 0}};
    const int n = poll(p, exporter.floor_fd() >= 0 ? 2 : 1, -1);
    if (n < 0 && errno != EINTR) {
      std::fprintf(stderr, "vmmipc_bench exporter: poll: %s\n", std::strerror(errno));
      return 1;
    }
    if (n <= 0) continue;
    if (exporter.floor_fd() >= 0 && p[1].revents != 0) exporter.ServeFloor();
    if (p[0].revents == 0) continue;
    Request request;
    if (!ReceiveMessage(kChannelFd, &request, sizeof(request), nullptr, -1, &error)) {
      if (!error.empty()) std::fprintf(stderr, "vmmipc_bench exporter: %s\n", error.c_str());
      return error.empty() ? 0 : 1;
    }
    Reply reply;
    if (static_cast<Op>(request.op) == Op::kQuit) {
      reply.op = request.op;
      SendMessage(kChannelFd, &reply, sizeof(reply), nullptr, 0, &error);
      return 0;
    }
    std::vector<int> fds;
    exporter.Handle(request, &reply, &fds);
    const bool sent = SendMessage(kChannelFd, &reply, sizeof(reply), fds.data(),
                                  static_cast<int>(fds.size()), &error);
    CloseAll(&fds);
    if (!sent) {
      std::fprintf(stderr, "vmmipc_bench exporter: %s\n", error.c_str());
      return 1;
    }
  }
}

// ---- the importer's client -----------------------------------------------------------------

ExporterClient& ExporterClient::Instance() {
  static ExporterClient* client = new ExporterClient(0);
  return *client;
}

ExporterClient& ExporterClient::Floor() {
  static ExporterClient* client = new ExporterClient(1);
  return *client;
}

bool ExporterClient::EnsureStarted(std::string* error) {
  if (!tried_) {
    tried_ = true;
    if (!Start(&start_error_)) {
      if (start_error_.empty()) start_error_ = "the exporter did not start";
      Stop();
    }
  }
  if (!start_error_.empty()) *error = start_error_;
  return start_error_.empty();
}

bool ExporterClient::Start(std::string* error) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    *error = ErrnoText("socketpair");
    return false;
  }
  // Above 3, so that dup2 onto fd 3 in the child always clears CLOEXEC.
  const int child_end = fcntl(sv[1], F_DUPFD_CLOEXEC, 10);
  close(sv[1]);
  if (child_end < 0) {
    close(sv[0]);
    *error = ErrnoText("fcntl(F_DUPFD_CLOEXEC)");
    return false;
  }
  fd_ = sv[0];

  std::vector<std::string> args = {self_exe_, "--vmmipc_exporter",
                                   "--vmmipc_device=" + std::to_string(device_),
                                   "--vmmipc_parent=" + std::to_string(getpid())};
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env_) envp.push_back(e.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, child_end, kChannelFd);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, self_exe_.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(child_end);
  if (rc != 0) {
    *error = "posix_spawn of the exporter (" + self_exe_ + "): " + std::strerror(rc);
    return false;
  }
  pid_ = pid;
  g_exporter_pids[slot_].store(pid);

  // The exporter's cuInit may take seconds on a cold GPU.
  Reply ready;
  std::string receive_error;
  if (!ReceiveMessage(fd_, &ready, sizeof(ready), nullptr, std::max(timeout_ms_, 120000),
                      &receive_error)) {
    *error = "exporter start-up: " +
             (receive_error.empty() ? std::string("it exited before it was ready") : receive_error);
    return false;
  }
  if (ready.op != static_cast<uint32_t>(Op::kReady) || ready.status != CUDA_SUCCESS) {
    *error = std::string("exporter start-up failed: ") + ready.text;
    return false;
  }
  device_name_ = ready.text;
  return true;
}

bool ExporterClient::Call(const Request& request, Reply* reply, std::vector<int>* fds,
                          std::string* error) {
  if (!EnsureStarted(error)) return false;
  // A broken channel is out of step for good: stop the exporter, and every later call fails
  // at once with the first error instead of waiting again.
  auto broken = [&](const std::string& what) {
    start_error_ = "the exporter is gone: " + what;
    *error = what;
    Stop();
    return false;
  };
  if (!SendMessage(fd_, &request, sizeof(request), nullptr, 0, error))
    return broken("to the exporter: " + *error);
  std::vector<int> received;
  if (!ReceiveMessage(fd_, reply, sizeof(*reply), &received, timeout_ms_, error))
    return broken("from the exporter: " + (error->empty() ? std::string("it exited") : *error));
  if (reply->op != request.op) {
    CloseAll(&received);
    return broken("exporter reply out of step (op " + std::to_string(reply->op) + " for " +
                  std::to_string(request.op) + ")");
  }
  if (fds != nullptr) {
    *fds = std::move(received);
  } else {
    CloseAll(&received);
  }
  return true;
}

bool ExporterClient::Buffer(int layout, bool vmm, RemoteBuffer* out, std::string* error) {
  auto key = std::make_pair(layout, vmm);
  auto it = buffers_.find(key);
  if (it == buffers_.end()) {
    RemoteBuffer b;
    if (!NewBuffer(layout, vmm, &b, error)) return false;
    it = buffers_.emplace(key, b).first;
  }
  *out = it->second;
  return true;
}

bool ExporterClient::NewBuffer(int layout, bool vmm, RemoteBuffer* out, std::string* error) {
  Request request;
  request.op = static_cast<uint32_t>(Op::kAlloc);
  request.arg[0] = static_cast<uint64_t>(layout);
  request.arg[1] = vmm ? 1 : 0;
  Reply reply;
  if (!Call(request, &reply, nullptr, error)) return false;
  if (reply.status != CUDA_SUCCESS) {
    *error = reply.text;
    return false;
  }
  out->id = static_cast<uint32_t>(reply.value[0]);
  out->layout = layout;
  out->vmm = vmm;
  out->base = reply.value[1];
  out->total = Layouts()[layout].Total();
  out->tag = static_cast<unsigned char>(reply.value[2]);
  return true;
}

bool ExporterClient::Free(const RemoteBuffer& buffer, std::string* error) {
  Request request;
  request.op = static_cast<uint32_t>(Op::kFree);
  request.id = buffer.id;
  Reply reply;
  if (!Call(request, &reply, nullptr, error)) return false;
  if (reply.status != CUDA_SUCCESS) {
    *error = reply.text;
    return false;
  }
  return true;
}

bool ExporterClient::FloorSocket(std::string* name, std::string* error) {
  if (floor_socket_.empty()) {
    Reply reply;
    if (!Simple(Op::kFloorStart, &reply, error)) return false;
    floor_socket_ = reply.text;
  }
  *name = floor_socket_;
  return true;
}

bool ExporterClient::Simple(Op op, Reply* reply, std::string* error) {
  Request request;
  request.op = static_cast<uint32_t>(op);
  if (!Call(request, reply, nullptr, error)) return false;
  if (reply->status != CUDA_SUCCESS) {
    *error = reply->text;
    return false;
  }
  return true;
}

bool ExporterClient::GetHandle(const RemoteBuffer& buffer, CUipcMemHandle* handle,
                               std::string* error) {
  Request request;
  request.op = static_cast<uint32_t>(Op::kGet);
  request.id = buffer.id;
  Reply reply;
  if (!Call(request, &reply, nullptr, error)) return false;
  if (reply.status != CUDA_SUCCESS) {
    *error = reply.text;
    return false;
  }
  std::memcpy(handle->reserved, reply.handle, CU_IPC_HANDLE_SIZE);
  return true;
}

void ExporterClient::Stop() {
  if (pid_ > 0) {
    if (fd_ >= 0) {
      Request quit;
      quit.op = static_cast<uint32_t>(Op::kQuit);
      std::string ignored;
      SendMessage(fd_, &quit, sizeof(quit), nullptr, 0, &ignored);
    }
    if (WaitPidBounded(pid_, 5000) == -2) {
      kill(pid_, SIGKILL);
      WaitPidBounded(pid_, 5000);
    }
    g_exporter_pids[slot_].store(-1);
    pid_ = -1;
  }
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  buffers_.clear();
  floor_socket_.clear();
}

void KillChildrenFromSignal() {
  for (auto& pid : g_exporter_pids) {
    const pid_t exporter = pid.load();
    if (exporter > 0) kill(exporter, SIGKILL);
  }
  const pid_t transient = g_transient_pid.load();
  if (transient > 0) kill(transient, SIGKILL);
}

void SetTransientChild(pid_t pid) { g_transient_pid.store(pid); }

}  // namespace vmmipc_bench
