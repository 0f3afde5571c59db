// A rank process of vmmipc_all_to_all: one CUDA context on its GPU, K buffers
// of one kind per phase, and the commands of the launcher, one at a time
// (all_to_all.h). It owns every driver call of the benchmark; the launcher
// makes none. It returns from main on kQuit so that vmmipc's VMMIPC_STATS
// report (an atexit handler) reaches its stderr, which the launcher reads.
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "all_to_all.h"
#include "all_to_all_floor.h"
#include "bench_common.h"

namespace vmmipc_all_to_all {
namespace {

using vmmipc_bench::CuFailure;
using vmmipc_bench::NowNs;
using vmmipc_bench::OwnedBuffer;

struct Opened {
  CUdeviceptr pointer = 0;
  uint32_t rank = 0;    // the exporter
  uint32_t buffer = 0;  // its buffer index
  FloorMapping floor;   // Kind::kFloor: what the floor mapped (pointer is floor.va)
};

class Rank {
 public:
  Rank(int rank, int device, int gpus) : rank_(rank), device_ordinal_(device), gpus_(gpus) {}

  // Initialises CUDA; on failure the hello reply carries the error.
  void Init() {
    int count = 0;
    CUresult r = cuInit(0);
    if (r == CUDA_SUCCESS) r = cuDeviceGetCount(&count);
    if (r != CUDA_SUCCESS) {
      init_error_ = CuFailure(r, "cuInit / cuDeviceGetCount");
      return;
    }
    device_count_ = count;
    if (device_ordinal_ >= count || gpus_ > count) {
      init_error_ = "rank " + std::to_string(rank_) + " needs GPU " +
                    std::to_string(device_ordinal_) + " of --gpus " + std::to_string(gpus_) +
                    ", but the driver sees " + std::to_string(count);
      return;
    }
    CUcontext context = nullptr;
    r = cuDeviceGet(&device_, device_ordinal_);
    if (r == CUDA_SUCCESS) r = cuDevicePrimaryCtxRetain(&context, device_);
    if (r == CUDA_SUCCESS) r = cuCtxSetCurrent(context);
    if (r != CUDA_SUCCESS) {
      init_error_ = CuFailure(r, "cuDeviceGet / primary context");
      return;
    }
    std::string error;
    for (const std::string& name : vmmipc_bench::HookedDriverNames(&error)) {
      if (name == "cuIpcGetMemHandle") hooks_ = true;
    }
    vmmipc_bench::RealDriver real;
    real_driver_error_.clear();
    if (!vmmipc_bench::LoadRealDriver(&real, &real_driver_error_) && real_driver_error_.empty())
      real_driver_error_ = "the real driver's entry points were not found";
  }

  // Serves commands until kQuit or the end of the channel.
  int Serve() {
    for (;;) {
      uint32_t type = 0;
      std::string payload, error;
      if (!ReceiveFrame(kChannelFd, &type, &payload, -1, &error)) {
        std::fprintf(stderr, "vmmipc_all_to_all rank %d: channel: %s\n", rank_, error.c_str());
        return 1;
      }
      Command c;
      std::vector<CUipcMemHandle> handles;
      Reply reply;
      if (!ParseCommand(payload, &c, &handles, &error)) {
        Fail(&reply, CUDA_SUCCESS, "bad command: " + error);
      } else if (!init_error_.empty() && c.cmd != static_cast<uint32_t>(Cmd::kQuit)) {
        Fail(&reply, CUDA_SUCCESS, init_error_);
      } else {
        Handle(c, handles, &reply);
      }
      if (!SendReply(kChannelFd, reply, &error)) {
        std::fprintf(stderr, "vmmipc_all_to_all rank %d: reply: %s\n", rank_, error.c_str());
        return 1;
      }
      if (c.cmd == static_cast<uint32_t>(Cmd::kQuit)) return 0;
    }
  }

 private:
  void Fail(Reply* reply, CUresult r, const std::string& text) {
    reply->head.status = static_cast<int32_t>(Status::kFailed);
    reply->head.cu_result = static_cast<int32_t>(r);
    std::snprintf(reply->head.text, sizeof(reply->head.text), "rank %d: %s", rank_, text.c_str());
  }

  void Handle(const Command& c, const std::vector<CUipcMemHandle>& handles, Reply* reply) {
    switch (static_cast<Cmd>(c.cmd)) {
      case Cmd::kHello:
        return Hello(reply);
      case Cmd::kAlloc:
        return Alloc(c, reply);
      case Cmd::kGet:
        return Get(reply);
      case Cmd::kHandles:
        all_handles_ = handles;
        if (static_cast<Kind>(cmd_.kind) == Kind::kFloor) FloorPrepare(reply);
        return;
      case Cmd::kOpen:
        return Open(reply);
      case Cmd::kCheck:
        return Check(reply);
      case Cmd::kClose:
        return Close(reply);
      case Cmd::kFree:
      case Cmd::kQuit:
        return Free();
    }
    Fail(reply, CUDA_SUCCESS, "unknown command " + std::to_string(c.cmd));
  }

  void Hello(Reply* reply) {
    char name[200] = {};
    if (cuDeviceGetName(name, sizeof(name), device_) != CUDA_SUCCESS) std::strcpy(name, "?");
    int driver = 0;
    cuDriverGetVersion(&driver);
    std::snprintf(reply->head.text, sizeof(reply->head.text),
                  "device=%s\npid=%d\nordinal=%d\ndevice_count=%d\ndriver_version=%d\nhooks=%s\n",
                  name, static_cast<int>(getpid()), device_ordinal_, device_count_, driver,
                  hooks_ ? "yes" : "no");
  }

  Tag MakeTag(uint32_t buffer, uint32_t chunk) const {
    Tag t;
    t.nonce = cmd_.nonce;
    t.rank = static_cast<uint32_t>(rank_);
    t.kind = cmd_.kind;
    t.config = cmd_.config;
    t.rep = cmd_.rep;
    t.buffer = buffer;
    t.chunk = chunk;
    return t;
  }

  uint64_t BufferBytes() const { return cmd_.chunk_size * cmd_.chunks; }

  // K buffers of one kind and their tags (kGet takes their handles).
  void Alloc(const Command& c, Reply* reply) {
    Free();  // nothing is left from an earlier phase, whatever happened there
    cmd_ = c;
    const bool floor = static_cast<Kind>(c.kind) == Kind::kFloor;
    const bool vmm = static_cast<Kind>(c.kind) == Kind::kVmm || floor;
    if (floor && !real_driver_error_.empty())
      return Fail(reply, CUDA_SUCCESS, "floor: " + real_driver_error_);
    vmmipc_bench::Layout layout;
    layout.name = "all-to-all";
    layout.chunks.assign(c.chunks, c.chunk_size);
    std::string error;
    for (uint64_t k = 0; k < c.buffers; ++k) {
      OwnedBuffer b;
      if (!vmmipc_bench::AllocBuffer(layout, vmm, device_, &b, &error)) {
        return Fail(reply, CUDA_SUCCESS,
                    std::string(KindName(static_cast<Kind>(c.kind))) + " buffer " +
                        std::to_string(k) + ": " + error);
      }
      own_.push_back(b);
      const uint32_t buffer = static_cast<uint32_t>(k);
      for (uint32_t chunk = 0; chunk <= c.chunks; ++chunk) {
        const bool end = chunk == c.chunks;
        Tag t = MakeTag(buffer, end ? kEndChunk : chunk);
        if (c.corrupt_tag != 0 && rank_ == 0 && k == 0 && chunk == 0) t.nonce ^= 1;
        const CUdeviceptr at = end ? b.base + b.total - sizeof(Tag) : b.base + chunk * c.chunk_size;
        const CUresult r = cuMemcpyHtoD(at, &t, sizeof(t));
        if (r != CUDA_SUCCESS) return Fail(reply, r, CuFailure(r, "cuMemcpyHtoD of a tag"));
      }
    }
    const CUresult r = cuCtxSynchronize();
    if (r != CUDA_SUCCESS) return Fail(reply, r, CuFailure(r, "cuCtxSynchronize"));
  }

  // cuIpcGetMemHandle on each buffer, timed (the floor: its fds exported).
  void Get(Reply* reply) {
    const bool floor = static_cast<Kind>(cmd_.kind) == Kind::kFloor;
    const bool vmm = static_cast<Kind>(cmd_.kind) == Kind::kVmm || floor;
    if (floor) return FloorHandles(reply);
    CUresult r = CUDA_SUCCESS;
    for (const OwnedBuffer& b : own_) {
      CUipcMemHandle h;
      const int64_t t0 = NowNs();
      r = cuIpcGetMemHandle(&h, b.base);
      const int64_t t1 = NowNs();
      if (r != CUDA_SUCCESS) {
        reply->samples.clear();
        reply->handles.clear();
        Fail(reply, r,
             CuFailure(r, std::string("cuIpcGetMemHandle on ") + (vmm ? "VMM" : "cuMemAlloc") +
                              " memory"));
        // The driver refuses VMM memory; only vmmipc makes it work. Without it in this
        // process that refusal is the expected answer, not a failure.
        if (vmm && !hooks_) reply->head.status = static_cast<int32_t>(Status::kUnsupported);
        return;
      }
      reply->samples.push_back(static_cast<double>(t1 - t0) * 1e-9);
      reply->handles.push_back(h);
    }
  }

  // Every peer's K handles, each open timed. Peers in the order rank+1, rank+2, ...
  // so that the ranks do not all start with the same exporter.
  void Open(Reply* reply) {
    if (static_cast<Kind>(cmd_.kind) == Kind::kFloor) return FloorOpen(reply);
    const uint64_t k_count = cmd_.buffers;
    const int n = static_cast<int>(k_count == 0 ? 0 : all_handles_.size() / k_count);
    int failed = 0;
    std::string first;
    CUresult first_result = CUDA_SUCCESS;
    for (int j = 1; j < n; ++j) {
      const int peer = (rank_ + j) % n;
      for (uint64_t k = 0; k < k_count; ++k) {
        CUdeviceptr p = 0;
        const int64_t t0 = NowNs();
        const CUresult r = cuIpcOpenMemHandle(&p, all_handles_[peer * k_count + k],
                                              CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
        const int64_t t1 = NowNs();
        if (r != CUDA_SUCCESS) {
          if (failed++ == 0) {
            first_result = r;
            first = CuFailure(r, "cuIpcOpenMemHandle of rank " + std::to_string(peer) + " buffer " +
                                     std::to_string(k));
          }
          continue;
        }
        reply->samples.push_back(static_cast<double>(t1 - t0) * 1e-9);
        opened_.push_back({p, static_cast<uint32_t>(peer), static_cast<uint32_t>(k), {}});
      }
    }
    if (failed > 0) {
      Fail(reply, first_result,
           std::to_string(failed) + " of " + std::to_string((n - 1) * k_count) +
               " opens failed; first: " + first);
    }
  }

  // Reads every tag through the importer's own mapping of it.
  void Check(Reply* reply) {
    int mismatches = 0;
    std::string first;
    for (const Opened& o : opened_) {
      for (uint32_t chunk = 0; chunk <= cmd_.chunks; ++chunk) {
        const bool end = chunk == cmd_.chunks;
        Tag expected = MakeTag(o.buffer, end ? kEndChunk : chunk);
        expected.rank = o.rank;
        const CUdeviceptr at =
            end ? o.pointer + BufferBytes() - sizeof(Tag) : o.pointer + chunk * cmd_.chunk_size;
        Tag got;
        const CUresult r = cuMemcpyDtoH(&got, at, sizeof(got));
        if (r != CUDA_SUCCESS) {
          return Fail(reply, r, CuFailure(r, "cuMemcpyDtoH of a tag through an opened pointer"));
        }
        if (std::memcmp(&got, &expected, sizeof(Tag)) == 0) continue;
        if (mismatches++ == 0) {
          char text[480];
          std::snprintf(
              text, sizeof(text),
              "rank %u buffer %u %s through 0x%llx: read rank %u buffer %u chunk %u "
              "rep %u config %u nonce %llx (expected config %u rep %u nonce %llx)",
              o.rank, o.buffer, end ? "end tag" : ("chunk " + std::to_string(chunk)).c_str(),
              static_cast<unsigned long long>(at), got.rank, got.buffer, got.chunk, got.rep,
              got.config, static_cast<unsigned long long>(got.nonce), expected.config, expected.rep,
              static_cast<unsigned long long>(expected.nonce));
          first = text;
        }
      }
    }
    if (mismatches > 0) {
      Fail(reply, CUDA_SUCCESS,
           "tag mismatch: " + std::to_string(mismatches) + " wrong tags; first: " + first);
    }
  }

  void Close(Reply* reply) {
    int failed = 0;
    std::string first;
    CUresult first_result = CUDA_SUCCESS;
    for (Opened& o : opened_) {
      if (o.floor.va != 0) {
        const int64_t t0 = NowNs();
        FloorRelease(&o.floor, cmd_.chunk_size);
        reply->samples.push_back(static_cast<double>(NowNs() - t0) * 1e-9);
        continue;
      }
      const int64_t t0 = NowNs();
      const CUresult r = cuIpcCloseMemHandle(o.pointer);
      const int64_t t1 = NowNs();
      if (r != CUDA_SUCCESS) {
        if (failed++ == 0) {
          first_result = r;
          first = CuFailure(r, "cuIpcCloseMemHandle of rank " + std::to_string(o.rank) +
                                   " buffer " + std::to_string(o.buffer));
        }
        continue;
      }
      reply->samples.push_back(static_cast<double>(t1 - t0) * 1e-9);
    }
    opened_.clear();
    if (failed > 0) {
      Fail(reply, first_result, std::to_string(failed) + " closes failed; first: " + first);
    }
  }

  // Whatever is still open or allocated (also after a failed phase).
  void Free() {
    for (Opened& o : opened_) {
      if (o.floor.va != 0) {
        FloorRelease(&o.floor, cmd_.chunk_size);
      } else {
        cuIpcCloseMemHandle(o.pointer);
      }
    }
    opened_.clear();
    for (FloorPending& p : floor_pending_) {
      for (int fd : p.fds) close(fd);
      FloorRelease(&p.opened.floor, cmd_.chunk_size);
    }
    floor_pending_.clear();
    for (int fd : floor_exported_) close(fd);
    floor_exported_.clear();
    for (OwnedBuffer& b : own_) vmmipc_bench::FreeBuffer(&b);
    own_.clear();
    all_handles_.clear();
  }

  // Kind::kFloor's get: each chunk's fd exported and kept (timed per buffer,
  // as a get), and the floor handle naming them.
  void FloorHandles(Reply* reply) {
    for (const OwnedBuffer& b : own_) {
      CUipcMemHandle h;
      std::string error;
      const int64_t t0 = NowNs();
      const bool ok = FloorExport(b, &floor_exported_, &h, &error);
      const int64_t t1 = NowNs();
      if (!ok) {
        reply->samples.clear();
        reply->handles.clear();
        return Fail(reply, CUDA_SUCCESS, error);
      }
      reply->samples.push_back(static_cast<double>(t1 - t0) * 1e-9);
      reply->handles.push_back(h);
    }
  }

  // Kind::kFloor, before the open (with the handles, outside the launcher's
  // clock): every peer's fds copied and every range reserved.
  void FloorPrepare(Reply* reply) {
    const uint64_t k_count = cmd_.buffers;
    const int n = static_cast<int>(k_count == 0 ? 0 : all_handles_.size() / k_count);
    floor_error_.clear();
    bool not_permitted = false;
    for (int j = 1; j < n && floor_error_.empty(); ++j) {
      const int peer = (rank_ + j) % n;
      for (uint64_t k = 0; k < k_count && floor_error_.empty(); ++k) {
        FloorPending p;
        p.opened.rank = static_cast<uint32_t>(peer);
        p.opened.buffer = static_cast<uint32_t>(k);
        if (FloorTakeFds(all_handles_[peer * k_count + k], &p.fds, &not_permitted, &floor_error_) &&
            FloorReserve(cmd_.chunk_size, p.fds.size(), &p.opened.floor, &floor_error_)) {
          p.opened.pointer = p.opened.floor.va;
        }
        floor_pending_.push_back(std::move(p));
      }
    }
    if (!floor_error_.empty()) {
      Fail(reply, CUDA_SUCCESS, "floor: " + floor_error_);
      if (not_permitted) reply->head.status = static_cast<int32_t>(Status::kUnsupported);
    }
  }

  // Kind::kFloor's open: each buffer's import, map and access, timed.
  void FloorOpen(Reply* reply) {
    std::string error = floor_error_;
    for (FloorPending& p : floor_pending_) {
      if (error.empty()) {
        const int64_t t0 = NowNs();
        const bool ok =
            FloorImportAndMap(&p.fds, cmd_.chunk_size, device_, &p.opened.floor, &error);
        const int64_t t1 = NowNs();
        if (ok) reply->samples.push_back(static_cast<double>(t1 - t0) * 1e-9);
      }
      for (int fd : p.fds) close(fd);
      if (p.opened.floor.va != 0) opened_.push_back(std::move(p.opened));
    }
    floor_pending_.clear();
    if (!error.empty()) {
      reply->samples.clear();
      Fail(reply, CUDA_SUCCESS, "floor: " + error);
    }
  }

  const int rank_;
  const int device_ordinal_;
  const int gpus_;
  CUdevice device_ = 0;
  int device_count_ = 0;
  bool hooks_ = false;
  std::string init_error_;
  std::string real_driver_error_;    // why the floor cannot run, if it cannot
  std::vector<int> floor_exported_;  // Kind::kFloor: the fds this rank exported, kept
  struct FloorPending {
    Opened opened;
    std::vector<int> fds;  // copies of the peer's fds, until imported
  };
  std::vector<FloorPending> floor_pending_;  // from the handles to the open
  std::string floor_error_;                  // why the preparation failed
  Command cmd_;
  std::vector<OwnedBuffer> own_;
  std::vector<CUipcMemHandle> all_handles_;
  std::vector<Opened> opened_;
};

long FlagValue(int argc, char** argv, const char* name, long fallback) {
  const size_t n = std::strlen(name);
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], name, n) == 0 && argv[i][n] == '=')
      return std::strtol(argv[i] + n + 1, nullptr, 10);
  }
  return fallback;
}

}  // namespace

int RankMain(int argc, char** argv) {
  // Die with the launcher, even inside a hung driver call.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  // The floor's peers copy this rank's exported fds with pidfd_getfd, which
  // needs ptrace rights: under Yama's ptrace_scope 1 siblings have them only
  // by this leave (no Yama: the call fails and changes nothing).
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  const long parent = FlagValue(argc, argv, "--parent", 0);
  if (parent != 0 && getppid() != static_cast<pid_t>(parent)) return 1;
  Rank rank(static_cast<int>(FlagValue(argc, argv, "--rank", 0)),
            static_cast<int>(FlagValue(argc, argv, "--device", 0)),
            static_cast<int>(FlagValue(argc, argv, "--gpus", 1)));
  rank.Init();
  return rank.Serve();
}

int CountGpusMain() {
  int count = 0;
  CUresult r = cuInit(0);
  if (r == CUDA_SUCCESS) r = cuDeviceGetCount(&count);
  if (r != CUDA_SUCCESS) {
    std::printf("error %s\n", CuFailure(r, "cuInit / cuDeviceGetCount").c_str());
    return 1;
  }
  std::printf("gpus %d\n", count);
  return 0;
}

}  // namespace vmmipc_all_to_all
