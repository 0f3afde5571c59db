// The exporter side of vmmipc_bench: a process (this binary run with
// --vmmipc_exporter) that owns the exported memory and answers the benchmark
// process (the importer) over a SOCK_SEQPACKET socketpair on its fd 3: buffers,
// handles from cuIpcGetMemHandle (vmmipc's hook when preloaded), copies on its
// own mapping. For the raw-driver floor it also serves POSIX fds by SCM_RIGHTS
// on an abstract socket, one connection per request as vmmipc's importer
// makes one per fetch. Two such processes run: the main exporter, and the
// floor exporter, which never exports through vmmipc, so that the benchmark
// alone decides which exported fds are alive in it (the driver's export cost
// depends on that: docs/benchmarks.md).
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
  kReady = 1,    // sent once by the exporter when its context is current; text: device name
  kPing,         // an empty round trip
  kAlloc,        // arg[0] layout, arg[1] 1 = VMM, 0 = legacy -> value[0] id, [1] base, [2] tag
  kFree,         // id: frees the buffer; its kept exported fds (kFloorDup) are closed with it
  kGet,          // id -> handle; us[0] the exporter's cuIpcGetMemHandle time
  kCopy,         // id -> us[0]: one cuMemcpyDtoD of the buffer into a scratch buffer + sync
  kProbeStart,   // -> text: the abstract name of an accept-and-echo socket (connect probe)
  kFloorStart,   // -> text: the abstract name of the floor socket (requests below)
  kDropExports,  // closes every exported fd the exporter keeps -> value[0]: how many
  kQuit,
  // Floor requests: one per connection to the floor socket, id -> one POSIX fd per chunk
  // (SCM_RIGHTS). us[0]: the exporter's time to make the fds; us[1]: its time to close its
  // copies of the previous request's fds after sending them.
  kFloorDup,    // one exported fd per chunk kept alive: exported on the first request, dup()ed
                // for each request, closed when the buffer is freed (or by kDropExports)
  kFloorFresh,  // a fresh export per chunk while another exported fd of the process (an
                // anchor, exported once and kept) is alive; closed after sending
  kFloorCliff,  // a fresh export per chunk with no other exported fd alive (every kept fd is
                // closed first): the driver sets its export state up and tears it down again
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
// Both exporters run it; which requests come decides what each does.
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
  // The main exporter: vmmipc's get, open, copies and the pieces.
  static ExporterClient& Instance();
  // The floor exporter: the raw-driver floor only (never exports through vmmipc).
  static ExporterClient& Floor();

  // Starts the exporter once (later calls return the first result).
  bool EnsureStarted(std::string* error);
  // Sends `request`, waits (bounded) for the reply; fds, if any, are returned
  // (CLOEXEC, owned by the caller).
  bool Call(const Request& request, Reply* reply, std::vector<int>* fds, std::string* error);
  // The exporter's buffer of this layout and kind, allocated on first use.
  bool Buffer(int layout, bool vmm, RemoteBuffer* out, std::string* error);
  // A new buffer each call (not cached); the caller frees it with Free.
  bool NewBuffer(int layout, bool vmm, RemoteBuffer* out, std::string* error);
  bool Free(const RemoteBuffer& buffer, std::string* error);
  // A handle of the buffer's base, got now by the exporter.
  bool GetHandle(const RemoteBuffer& buffer, CUipcMemHandle* handle, std::string* error);
  // The abstract name of the exporter's floor socket (started on first use).
  bool FloorSocket(std::string* name, std::string* error);
  // Sends `op` (kDropExports, ...) without arguments and checks the status.
  bool Simple(Op op, Reply* reply, std::string* error);
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
  explicit ExporterClient(int slot) : slot_(slot) {}
  bool Start(std::string* error);

  const int slot_;  // which of the two exporters, for the signal handler's pid table
  std::string self_exe_;
  int device_ = 0;
  std::vector<std::string> env_;
  int timeout_ms_ = 60000;
  bool tried_ = false;
  std::string start_error_;
  int fd_ = -1;
  pid_t pid_ = -1;
  std::string device_name_;
  std::string floor_socket_;
  std::map<std::pair<int, bool>, RemoteBuffer> buffers_;
};

// Kills both exporters and any load-test child at once (async-signal-safe).
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
