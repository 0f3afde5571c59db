// The launcher <-> rank channel of vmmipc_all_to_all: length-prefixed frames
// on a SOCK_STREAM socketpair, every read bounded by a deadline, and the
// (de)serialisation of commands and replies. Both ends are this binary, so
// structs go over the wire as they are.
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "all_to_all.h"

namespace vmmipc_all_to_all {
namespace {

constexpr uint32_t kMagic = 0x41324131;               // "A2A1"
constexpr uint64_t kMaxFrame = 256ull * 1024 * 1024;  // far above N x K x 64 bytes

struct FrameHead {
  uint32_t magic = kMagic;
  uint32_t type = 0;
  uint64_t size = 0;
};

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool WriteAll(int fd, const void* data, size_t size, std::string* error) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *error = std::string("send: ") + (n < 0 ? std::strerror(errno) : "no progress");
      return false;
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// Reads exactly `size` bytes before `deadline_ms` (< 0: none).
bool ReadAll(int fd, void* data, size_t size, int64_t deadline_ms, std::string* error) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    int wait_ms = -1;
    if (deadline_ms >= 0) {
      const int64_t left = deadline_ms - NowMs();
      if (left <= 0) {
        *error = "timed out";
        return false;
      }
      wait_ms = static_cast<int>(left);
    }
    pollfd pfd = {fd, POLLIN, 0};
    const int r = poll(&pfd, 1, wait_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      *error = std::string("poll: ") + std::strerror(errno);
      return false;
    }
    if (r == 0) continue;  // the deadline check above ends the loop
    const ssize_t n = recv(fd, p, size, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) {
      *error = std::string("recv: ") + std::strerror(errno);
      return false;
    }
    if (n == 0) {
      *error = "end of stream (the other side exited)";
      return false;
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kLegacy:
      return "legacy";
    case Kind::kVmm:
      return "vmmipc";
    case Kind::kFloor:
      return "floor";
  }
  return "?";
}

bool SendFrame(int fd, uint32_t type, const void* data, size_t size, std::string* error) {
  FrameHead head;
  head.type = type;
  head.size = size;
  return WriteAll(fd, &head, sizeof(head), error) && WriteAll(fd, data, size, error);
}

bool ReceiveFrame(int fd, uint32_t* type, std::string* payload, int timeout_ms,
                  std::string* error) {
  const int64_t deadline = timeout_ms < 0 ? -1 : NowMs() + timeout_ms;
  FrameHead head;
  if (!ReadAll(fd, &head, sizeof(head), deadline, error)) return false;
  if (head.magic != kMagic || head.size > kMaxFrame) {
    *error = "malformed frame";
    return false;
  }
  payload->resize(head.size);
  if (!ReadAll(fd, payload->data(), head.size, deadline, error)) return false;
  *type = head.type;
  return true;
}

bool SendCommand(int fd, const Command& command, const std::vector<CUipcMemHandle>& handles,
                 std::string* error) {
  Command c = command;
  c.handle_count = static_cast<uint32_t>(handles.size());
  std::string payload(reinterpret_cast<const char*>(&c), sizeof(c));
  payload.append(reinterpret_cast<const char*>(handles.data()),
                 handles.size() * sizeof(CUipcMemHandle));
  return SendFrame(fd, c.cmd, payload.data(), payload.size(), error);
}

bool ParseCommand(const std::string& payload, Command* command,
                  std::vector<CUipcMemHandle>* handles, std::string* error) {
  if (payload.size() < sizeof(Command)) {
    *error = "short command";
    return false;
  }
  std::memcpy(command, payload.data(), sizeof(Command));
  if (payload.size() != sizeof(Command) + command->handle_count * sizeof(CUipcMemHandle)) {
    *error = "command size does not match its handle count";
    return false;
  }
  handles->resize(command->handle_count);
  // memcpy of 0 bytes from or to the null data() of an empty vector is still
  // undefined behaviour (UBSan says so): copy only what there is.
  if (!handles->empty())
    std::memcpy(handles->data(), payload.data() + sizeof(Command),
                command->handle_count * sizeof(CUipcMemHandle));
  return true;
}

bool SendReply(int fd, const Reply& reply, std::string* error) {
  ReplyHead head = reply.head;
  head.samples = static_cast<uint32_t>(reply.samples.size());
  head.handles = static_cast<uint32_t>(reply.handles.size());
  std::string payload(reinterpret_cast<const char*>(&head), sizeof(head));
  payload.append(reinterpret_cast<const char*>(reply.samples.data()),
                 reply.samples.size() * sizeof(double));
  payload.append(reinterpret_cast<const char*>(reply.handles.data()),
                 reply.handles.size() * sizeof(CUipcMemHandle));
  return SendFrame(fd, 0, payload.data(), payload.size(), error);
}

bool ParseReply(const std::string& payload, Reply* reply, std::string* error) {
  if (payload.size() < sizeof(ReplyHead)) {
    *error = "short reply";
    return false;
  }
  std::memcpy(&reply->head, payload.data(), sizeof(ReplyHead));
  reply->head.text[sizeof(reply->head.text) - 1] = '\0';
  const size_t samples = reply->head.samples, handles = reply->head.handles;
  if (payload.size() !=
      sizeof(ReplyHead) + samples * sizeof(double) + handles * sizeof(CUipcMemHandle)) {
    *error = "reply size does not match its counts";
    return false;
  }
  reply->samples.resize(samples);
  if (samples != 0)
    std::memcpy(reply->samples.data(), payload.data() + sizeof(ReplyHead),
                samples * sizeof(double));
  reply->handles.resize(handles);
  if (handles != 0)
    std::memcpy(reply->handles.data(),
                payload.data() + sizeof(ReplyHead) + samples * sizeof(double),
                handles * sizeof(CUipcMemHandle));
  return true;
}

}  // namespace vmmipc_all_to_all
