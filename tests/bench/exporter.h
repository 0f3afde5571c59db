// The exporter side of vmmipc_bench: a second process (this binary run with
// --vmmipc_exporter) that owns the exported memory and answers the benchmark
// process (the importer) over a SOCK_SEQPACKET socketpair on its fd 3: buffers,
// handles from cuIpcGetMemHandle (vmmipc's hook when preloaded), POSIX fds by
// SCM_RIGHTS for the raw-driver floor, copies on its own mapping.
#pragma once

#include <cuda.h>
#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace vmmipc_bench {

enum class Op : uint32_t {
  kReady = 1,   // sent once by the exporter when its context is current; text: device name
  kPing,        // an empty round trip
  kAlloc,       // arg[0] layout, arg[1] 1 = VMM, 0 = legacy -> value[0] id, [1] base, [2] tag
  kGet,         // id -> handle; us[0] the exporter's cuIpcGetMemHandle time
  kExport,      // id -> one POSIX fd per chunk (SCM_RIGHTS); us[0] the export time
  kCopy,        // id -> us[0]: one cuMemcpyDtoD of the buffer into a scratch buffer + sync
  kProbeStart,  // -> text: the abstract name of an accept-and-echo socket (connect probe)
  kQuit,
};

struct Request {
  uint32_t op = 0;
  uint32_t id = 0;
  uint64_t arg[2] = {0, 0};
};

constexpr int32_t kNotCuda = -1;     // Reply::status of a failure that is not a CUresult
constexpr int kMaxFds = 253;         // SCM_MAX_FD: fds in one SCM_RIGHTS message
constexpr uint64_t kTagBytes = 256;  // the last bytes of every buffer hold its tag byte

struct Reply {
  uint32_t op = 0;
  int32_t status = 0;  // CUDA_SUCCESS, a CUresult, or kNotCuda
  uint64_t value[3] = {0, 0, 0};
  double us[2] = {0, 0};
  unsigned char handle[CU_IPC_HANDLE_SIZE] = {};
  char text[256] = {};
};

// The exporter's main (argv: --vmmipc_exporter --vmmipc_device=N --vmmipc_parent=PID).
int ExporterMain(int argc, char** argv);

// One buffer the exporter owns.
struct RemoteBuffer {
  uint32_t id = 0;
  int layout = 0;
  bool vmm = false;
  uint64_t base = 0;   // exporter address
  uint64_t total = 0;  // bytes
  unsigned char tag = 0;
};

// The importer's end: starts, talks to and stops the exporter process.
class ExporterClient {
 public:
  static ExporterClient& Instance();

  // Starts the exporter once (later calls return the first result).
  bool EnsureStarted(std::string* error);
  // Sends `request`, waits (bounded) for the reply; fds, if any, are returned
  // (CLOEXEC, owned by the caller).
  bool Call(const Request& request, Reply* reply, std::vector<int>* fds, std::string* error);
  // The exporter's buffer of this layout and kind, allocated on first use.
  bool Buffer(int layout, bool vmm, RemoteBuffer* out, std::string* error);
  // A handle of the buffer's base, got now by the exporter.
  bool GetHandle(const RemoteBuffer& buffer, CUipcMemHandle* handle, std::string* error);
  // Asks the exporter to quit, waits up to 5 s, then kills it.
  void Stop();

  // Set before the first EnsureStarted.
  void Configure(std::string self_exe, int device, std::vector<std::string> env, double timeout_s) {
    self_exe_ = std::move(self_exe);
    device_ = device;
    env_ = std::move(env);
    timeout_ms_ = static_cast<int>(timeout_s * 1000);
  }
  const std::string& device_name() const { return device_name_; }

 private:
  ExporterClient() = default;
  bool Start(std::string* error);

  std::string self_exe_;
  int device_ = 0;
  std::vector<std::string> env_;
  int timeout_ms_ = 60000;
  bool tried_ = false;
  std::string start_error_;
  int fd_ = -1;
  pid_t pid_ = -1;
  std::string device_name_;
  std::map<std::pair<int, bool>, RemoteBuffer> buffers_;
};

// Kills the exporter and any load-test child at once (async-signal-safe).
void KillChildrenFromSignal();
// The pid of a short-lived child being waited for (load tests), for the signal handler.
void SetTransientChild(pid_t pid);

// SCM_RIGHTS message helpers (SOCK_SEQPACKET: one message per call).
bool SendMessage(int fd, const void* data, size_t size, const int* fds, int fd_count,
                 std::string* error);
// timeout_ms < 0: wait forever. Returns false with *error (empty on a clean
// end of stream) on failure.
bool ReceiveMessage(int fd, void* data, size_t size, std::vector<int>* fds, int timeout_ms,
                    std::string* error);

}  // namespace vmmipc_bench
