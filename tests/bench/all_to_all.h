// vmmipc_all_to_all: what the launcher and its rank processes share. The
// wire format of their socketpair (length-prefixed messages on a stream
// socket: a handle all-gather of N x K x 64 bytes does not fit the size limit
// of one datagram), the tag every buffer carries, and the two mains.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>
#include <vector>

namespace vmmipc_all_to_all {

constexpr int kChannelFd = 3;  // a rank's end of its socketpair to the launcher

// The kinds of buffer every configuration registers, in the same run: legacy
// IPC on cuMemAlloc memory, vmmipc on VMM memory, and (--floor) the driver's
// floor on VMM memory (all_to_all_floor.h).
enum class Kind : uint32_t { kLegacy = 0, kVmm = 1, kFloor = 2 };
constexpr int kKinds = 3;
const char* KindName(Kind kind);  // "legacy", "vmmipc", "floor"

// Launcher -> rank. Every command gets exactly one reply; the launcher waits
// for all N replies before it sends the next command, so each is a barrier.
enum class Cmd : uint32_t {
  kHello = 1,  // -> Hello text; the rank's context is current
  kAlloc,      // allocate K buffers, write their tags -> ack
  kGet,        // cuIpcGetMemHandle of each buffer (timed; the floor: export its fds)
               // -> samples: get times; handles: K
  kHandles,    // payload: the N x K handles of every rank (rank-major) -> ack
  kOpen,       // open every peer's K handles (each timed) -> samples: open times
  kCheck,      // read every tag through the opened pointers -> ack, or a mismatch
  kClose,      // cuIpcCloseMemHandle of everything opened -> samples: close times
  kFree,       // free the K buffers (also after a failed or refused phase) -> ack
  kQuit,       // -> ack, then the rank returns from main (the VMMIPC_STATS report runs)
};

struct Command {
  uint32_t cmd = 0;
  uint32_t kind = 0;          // Kind
  uint32_t config = 0;        // configuration index (tags), kWarmupConfig for the warm-up
  uint32_t rep = 0;           // repetition (tags)
  uint64_t buffers = 0;       // K
  uint64_t chunk_size = 0;    // S, bytes
  uint64_t chunks = 0;        // C
  uint64_t nonce = 0;         // the launcher's run id (tags): no stale mapping of another run
  uint32_t corrupt_tag = 0;   // test only: rank 0 writes a wrong tag into its buffer 0
  uint32_t handle_count = 0;  // kHandles: handles that follow
};

constexpr uint32_t kWarmupConfig = 0xffffffffu;

// Reply status.
enum class Status : int32_t {
  kOk = 0,
  kFailed = 1,       // wrong data, or a call that must work failed
  kUnsupported = 2,  // cuIpcGetMemHandle refused VMM memory and vmmipc is not in the rank,
                     // or the floor may not copy a peer's fds (no ptrace rights)
};

struct ReplyHead {
  int32_t status = 0;     // Status
  int32_t cu_result = 0;  // the failing CUresult, if any
  uint32_t samples = 0;   // doubles (seconds) that follow
  uint32_t handles = 0;   // CUipcMemHandle (64 bytes each) that follow the samples
  char text[512] = {};    // error, or the hello text
};

struct Reply {
  ReplyHead head;
  std::vector<double> samples;
  std::vector<CUipcMemHandle> handles;
};

// The tag at the start of every chunk and at the end of every buffer. The
// importer computes the expected value itself and compares every byte.
struct Tag {
  uint64_t nonce = 0;
  uint32_t rank = 0;
  uint32_t kind = 0;
  uint32_t config = 0;
  uint32_t rep = 0;
  uint32_t buffer = 0;
  uint32_t chunk = 0;  // kEndChunk for the tag at the end of the buffer
};
constexpr uint32_t kEndChunk = 0xffffffffu;
static_assert(sizeof(Tag) == 32);

// ---- the channel (all waits bounded) --------------------------------------------------------

// One message: a 16-byte header (magic, type, size) then `size` bytes.
bool SendFrame(int fd, uint32_t type, const void* data, size_t size, std::string* error);
// timeout_ms < 0: wait forever. False with *error on timeout, end of stream or a bad frame.
bool ReceiveFrame(int fd, uint32_t* type, std::string* payload, int timeout_ms, std::string* error);

bool SendCommand(int fd, const Command& command, const std::vector<CUipcMemHandle>& handles,
                 std::string* error);
bool ParseCommand(const std::string& payload, Command* command,
                  std::vector<CUipcMemHandle>* handles, std::string* error);
bool SendReply(int fd, const Reply& reply, std::string* error);
bool ParseReply(const std::string& payload, Reply* reply, std::string* error);

// ---- the processes ---------------------------------------------------------------------------

// The rank: argv "--vmmipc_rank_child --rank=I --device=D --gpus=G --parent=PID".
int RankMain(int argc, char** argv);
// "--vmmipc_count_gpus": prints "gpus N" (or "error TEXT") and exits; the launcher runs it
// as a child because it never initialises CUDA itself.
int CountGpusMain();
// The launcher (everything else on the command line).
int LauncherMain(int argc, char** argv);

}  // namespace vmmipc_all_to_all
