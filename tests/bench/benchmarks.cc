// The benchmarks of vmmipc_bench. Every one times single operations itself
// (manual time: only the isolated phase counts) and also reports the median
// and minimum of its samples as counters (p50_us, min_us), so a repetition's
// median is robust to the odd slow sample.
#include "benchmarks.h"

#include <benchmark/benchmark.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <utility>

#include "bench_common.h"
#include "exporter.h"

namespace vmmipc_bench {
namespace {

Options g_opt;
bool g_failed = false;
std::map<std::pair<int, bool>, OwnedBuffer> g_local;  // the importer's own buffers
CUdeviceptr g_scratch = 0;                            // copy destination in the importer
uint64_t g_scratch_size = 0;

constexpr unsigned int kOpenFlags = CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS;

void Marker(const std::string& name) {
  if (!g_opt.phase_markers) return;
  std::fprintf(stderr, "vmmipc_bench: begin %s\n", name.c_str());
  std::fflush(stderr);
}

void Fail(benchmark::State& state, const std::string& name, const std::string& message) {
  g_failed = true;
  std::fprintf(stderr, "vmmipc_bench: %s: %s\n", name.c_str(), message.c_str());
  state.SkipWithError(message.c_str());
}

int64_t Iters(double base) { return std::max<int64_t>(2, std::llround(base * g_opt.iters_scale)); }

void TimeCounters(benchmark::State& state, const Samples& s, const std::string& prefix) {
  if (s.empty()) return;
  state.counters[prefix + "p50_us"] = s.MedianUs();
  state.counters[prefix + "min_us"] = s.MinUs();
}

bool LocalBuffer(int layout, bool vmm, OwnedBuffer** out, std::string* error) {
  auto key = std::make_pair(layout, vmm);
  auto it = g_local.find(key);
  if (it == g_local.end()) {
    OwnedBuffer b;
    if (!AllocBuffer(Layouts()[layout], vmm, g_opt.cu_device, &b, error)) return false;
    it = g_local.emplace(key, b).first;
  }
  *out = &it->second;
  return true;
}

bool Scratch(uint64_t size, CUdeviceptr* out, std::string* error) {
  if (g_scratch_size < size) {
    if (g_scratch != 0) cuMemFree(g_scratch);
    g_scratch = 0;
    g_scratch_size = 0;
    const CUresult r = cuMemAlloc(&g_scratch, size);
    if (r != CUDA_SUCCESS) {
      *error = CuFailure(r, "cuMemAlloc of the copy destination");
      return false;
    }
    g_scratch_size = size;
  }
  *out = g_scratch;
  return true;
}

// The last kTagBytes of the buffer, read through the importer's mapping, hold its tag.
bool VerifyTag(CUdeviceptr pointer, const RemoteBuffer& b, std::string* error) {
  unsigned char host[kTagBytes];
  const CUresult r = cuMemcpyDtoH(host, pointer + b.total - kTagBytes, kTagBytes);
  if (r != CUDA_SUCCESS) {
    *error = CuFailure(r, "cuMemcpyDtoH through the imported mapping");
    return false;
  }
  for (uint64_t i = 0; i < kTagBytes; ++i) {
    if (host[i] != b.tag) {
      *error = "the imported mapping does not show the exporter's data (byte " + std::to_string(i) +
               " of the tail)";
      return false;
    }
  }
  return true;
}

// Opens a fresh handle of `b` and checks the data; the caller closes.
bool OpenChecked(const RemoteBuffer& b, CUipcMemHandle* handle, CUdeviceptr* pointer,
                 std::string* error) {
  ExporterClient& ex = ExporterClient::Instance();
  if (!ex.GetHandle(b, handle, error)) return false;
  const CUresult r = cuIpcOpenMemHandle(pointer, *handle, kOpenFlags);
  if (r != CUDA_SUCCESS) {
    *error = CuFailure(r, "cuIpcOpenMemHandle");
    return false;
  }
  if (!VerifyTag(*pointer, b, error)) {
    cuIpcCloseMemHandle(*pointer);
    return false;
  }
  return true;
}

// ---- get and passthrough -------------------------------------------------------------------

using GetFn = CUresult (*)(CUipcMemHandle*, CUdeviceptr);
using AttrFn = CUresult (*)(void*, CUpointer_attribute, CUdeviceptr);

// The passthrough pair: cuIpcGetMemHandle in this process on its own memory
// through `fn` (the linked symbol, or the real driver's entry point).
void BmGet(benchmark::State& state, const std::string& name, int layout, bool vmm, GetFn fn) {
  Marker(name);
  std::string error;
  OwnedBuffer* b = nullptr;
  if (!LocalBuffer(layout, vmm, &b, &error)) return Fail(state, name, error);
  CUipcMemHandle handle;
  // Warm-up: vmmipc's first export of a process starts its listener.
  CUresult r = fn(&handle, b->base);
  if (r != CUDA_SUCCESS) return Fail(state, name, CuFailure(r, "cuIpcGetMemHandle (warm-up)"));
  Samples s;
  for (auto _ : state) {
    const int64_t t0 = NowNs();
    r = fn(&handle, b->base);
    const int64_t t1 = NowNs();
    if (r != CUDA_SUCCESS) {
      Fail(state, name, CuFailure(r, "cuIpcGetMemHandle"));
      break;
    }
    state.SetIterationTime(static_cast<double>(t1 - t0) * 1e-9);
    s.AddNs(t1 - t0);
  }
  TimeCounters(state, s, "");
}

// Times one request `op` on one of the exporter's buffers per iteration, as
// the exporter measured it, after one untimed warm-up request. False (and the
// benchmark failed) when the buffer or the warm-up cannot be had.
bool TimeInExporter(benchmark::State& state, const std::string& name, int layout, bool vmm, Op op,
                    RemoteBuffer* b, Samples* s) {
  Marker(name);
  std::string error;
  ExporterClient& ex = ExporterClient::Instance();
  if (!ex.Buffer(layout, vmm, b, &error)) {
    Fail(state, name, error);
    return false;
  }
  Request request;
  request.op = static_cast<uint32_t>(op);
  request.id = b->id;
  Reply reply;
  if (!ex.Call(request, &reply, nullptr, &error) || reply.status != CUDA_SUCCESS) {
    Fail(state, name, error.empty() ? reply.text : error);
    return false;
  }
  for (auto _ : state) {
    if (!ex.Call(request, &reply, nullptr, &error) || reply.status != CUDA_SUCCESS) {
      Fail(state, name, error.empty() ? reply.text : error);
      break;
    }
    state.SetIterationTime(reply.us[0] * 1e-6);
    s->Add(reply.us[0] * 1e-6);
  }
  return true;
}

// cuIpcGetMemHandle in the exporter (a ranked process, as in a deployment), on
// its own memory, timed there; one request per iteration. The warm-up matters:
// vmmipc's first export of a process starts its listener.
void BmGetInExporter(benchmark::State& state, const std::string& name, int layout, bool vmm) {
  RemoteBuffer b;
  Samples s;
  if (TimeInExporter(state, name, layout, vmm, Op::kGet, &b, &s)) TimeCounters(state, s, "");
}

void BmAttribute(benchmark::State& state, const std::string& name, AttrFn fn) {
  Marker(name);
  std::string error;
  OwnedBuffer* b = nullptr;
  if (!LocalBuffer(0, false, &b, &error)) return Fail(state, name, error);
  int value = 0;
  CUresult r = fn(&value, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, b->base);
  if (r != CUDA_SUCCESS) return Fail(state, name, CuFailure(r, "cuPointerGetAttribute"));
  Samples s;
  for (auto _ : state) {
    const int64_t t0 = NowNs();
    r = fn(&value, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, b->base);
    const int64_t t1 = NowNs();
    if (r != CUDA_SUCCESS) {
      Fail(state, name, CuFailure(r, "cuPointerGetAttribute"));
      break;
    }
    state.SetIterationTime(static_cast<double>(t1 - t0) * 1e-9);
    s.AddNs(t1 - t0);
  }
  TimeCounters(state, s, "");
}

// ---- open, reopen, close -------------------------------------------------------------------

// A first open each iteration: the exporter gets the handle anew, the importer
// opens it (timed) and closes it (close_p50_us), so nothing of it stays mapped.
void BmOpen(benchmark::State& state, const std::string& name, int layout, bool vmm) {
  Marker(name);
  std::string error;
  ExporterClient& ex = ExporterClient::Instance();
  RemoteBuffer b;
  if (!ex.Buffer(layout, vmm, &b, &error)) return Fail(state, name, error);
  CUipcMemHandle handle;
  CUdeviceptr p = 0;
  // Warm-up (untimed): one-time costs such as vmmipc's import zone reservation.
  if (!OpenChecked(b, &handle, &p, &error)) return Fail(state, name, "warm-up: " + error);
  CUresult r = cuIpcCloseMemHandle(p);
  if (r != CUDA_SUCCESS) return Fail(state, name, CuFailure(r, "cuIpcCloseMemHandle (warm-up)"));
  Samples open, close, get;
  for (auto _ : state) {
    const int64_t g0 = NowNs();
    if (!ex.GetHandle(b, &handle, &error)) {
      Fail(state, name, error);
      break;
    }
    const int64_t t0 = NowNs();
    r = cuIpcOpenMemHandle(&p, handle, kOpenFlags);
    const int64_t t1 = NowNs();
    if (r != CUDA_SUCCESS) {
      Fail(state, name, CuFailure(r, "cuIpcOpenMemHandle"));
      break;
    }
    r = cuIpcCloseMemHandle(p);
    const int64_t t2 = NowNs();
    if (r != CUDA_SUCCESS) {
      Fail(state, name, CuFailure(r, "cuIpcCloseMemHandle"));
      break;
    }
    state.SetIterationTime(static_cast<double>(t1 - t0) * 1e-9);
    open.AddNs(t1 - t0);
    close.AddNs(t2 - t1);
    get.AddNs(t0 - g0);
  }
  TimeCounters(state, open, "");
  TimeCounters(state, close, "close_");
  if (!get.empty()) state.counters["remote_get_p50_us"] = get.MedianUs();
}

// A first open of a chunk never exported before (issue 11's "first open of a chunk"): each
// iteration the exporter allocates a fresh buffer and gets its handle, the importer opens it
// (timed), checks its tag (a fresh buffer may sit at the address of the last one: a stale
// mapping would show the old tag) and closes it, and the exporter frees the buffer; all but
// the open untimed. Before the loop the exporter's persistent buffer of this layout is opened
// once: a vmmipc that keeps exported fds keeps that one alive, the anchor of floor_fresh.
void BmOpenFresh(benchmark::State& state, const std::string& name, int layout) {
  Marker(name);
  std::string error;
  ExporterClient& ex = ExporterClient::Instance();
  RemoteBuffer anchor;
  if (!ex.Buffer(layout, true, &anchor, &error)) return Fail(state, name, error);
  CUipcMemHandle handle;
  CUdeviceptr p = 0;
  if (!OpenChecked(anchor, &handle, &p, &error)) return Fail(state, name, "anchor: " + error);
  CUresult r = cuIpcCloseMemHandle(p);
  if (r != CUDA_SUCCESS) return Fail(state, name, CuFailure(r, "cuIpcCloseMemHandle (anchor)"));
  Samples open, close, get;
  // One cycle: fresh buffer, get, open (timed), tag check, close, free. False: failed.
  auto cycle = [&](bool timed) -> bool {
    RemoteBuffer b;
    if (!ex.NewBuffer(layout, true, &b, &error)) return false;
    const int64_t g0 = NowNs();
    const bool got = ex.GetHandle(b, &handle, &error);
    const int64_t t0 = NowNs();
    r = got ? cuIpcOpenMemHandle(&p, handle, kOpenFlags) : CUDA_SUCCESS;
    const int64_t t1 = NowNs();
    bool ok = got && r == CUDA_SUCCESS;
    if (got && r != CUDA_SUCCESS) error = CuFailure(r, "cuIpcOpenMemHandle (fresh chunk)");
    if (ok) {
      ok = VerifyTag(p, b, &error);
      const int64_t c0 = NowNs();
      r = cuIpcCloseMemHandle(p);
      const int64_t c1 = NowNs();
      if (ok && r != CUDA_SUCCESS) {
        ok = false;
        error = CuFailure(r, "cuIpcCloseMemHandle");
      }
      if (ok && timed) {
        state.SetIterationTime(static_cast<double>(t1 - t0) * 1e-9);
        open.AddNs(t1 - t0);
        close.AddNs(c1 - c0);
        get.AddNs(t0 - g0);
      }
    }
    std::string free_error;
    if (!ex.Free(b, &free_error) && ok) {
      ok = false;
      error = "free in the exporter: " + free_error;
    }
    return ok;
  };
  if (!cycle(false)) return Fail(state, name, "warm-up: " + error);
  for (auto _ : state) {
    if (!cycle(true)) {
      Fail(state, name, error);
      break;
    }
  }
  TimeCounters(state, open, "");
  TimeCounters(state, close, "close_");
  if (!get.empty()) state.counters["remote_get_p50_us"] = get.MedianUs();
}

// The same handle while it is open: reference counting only (timed), then the
// matching close of that extra reference (close_p50_us).
void BmReopen(benchmark::State& state, const std::string& name, int layout, bool vmm) {
  Marker(name);
  std::string error;
  RemoteBuffer b;
  if (!ExporterClient::Instance().Buffer(layout, vmm, &b, &error)) return Fail(state, name, error);
  CUipcMemHandle handle;
  CUdeviceptr first = 0;
  if (!OpenChecked(b, &handle, &first, &error)) return Fail(state, name, error);
  Samples open, close;
  for (auto _ : state) {
    CUdeviceptr p = 0;
    const int64_t t0 = NowNs();
    CUresult r = cuIpcOpenMemHandle(&p, handle, kOpenFlags);
    const int64_t t1 = NowNs();
    if (r != CUDA_SUCCESS) {
      Fail(state, name, CuFailure(r, "cuIpcOpenMemHandle (reopen)"));
      break;
    }
    r = cuIpcCloseMemHandle(p);
    const int64_t t2 = NowNs();
    if (r != CUDA_SUCCESS || p != first) {
      Fail(state, name,
           r != CUDA_SUCCESS ? CuFailure(r, "cuIpcCloseMemHandle (reopen)")
                             : "reopen returned a different pointer");
      break;
    }
    state.SetIterationTime(static_cast<double>(t1 - t0) * 1e-9);
    open.AddNs(t1 - t0);
    close.AddNs(t2 - t1);
  }
  const CUresult r = cuIpcCloseMemHandle(first);
  if (r != CUDA_SUCCESS) Fail(state, name, CuFailure(r, "cuIpcCloseMemHandle (last)"));
  TimeCounters(state, open, "");
  TimeCounters(state, close, "close_");
}

// ---- the raw-driver floor -----------------------------------------------------------------

// The floor is the best sequence the driver allows for one open, by hand with the real
// driver's entry points, against the floor exporter (a process that never exports through
// vmmipc): connect to its abstract socket (as vmmipc's importer connects per fetch), one
// request, one reply with one POSIX fd per chunk; import each, close each received fd, map
// each chunk into a range reserved once per benchmark (as vmmipc reserves its import zone
// once), set access once over the range. Unmap and release afterwards, untimed.
//
// What the exporter does per request is the variable (exporter.h): the driver makes an
// exported fd cost ~600 us when no other exported fd of the process is alive (it sets up its
// export state) and ~550 us more when the last one is closed (it tears it down), but ~35 us
// while one is alive, and dup() of an exported fd costs ~1 us (H200, driver 580):
//   floor/<size>        kFloorDup: the chunk is already exported and its fd kept; each
//                       request dup()s it. A first open of an already exported chunk.
//   floor_fresh/<size>  kFloorFresh: a fresh export while another exported fd (an anchor)
//                       is alive. A first open of a chunk never exported before.
//   cliff/<size>        kFloorCliff: export and close per request with nothing else alive,
//                       what an exporter without kept fds pays (the old floor).
struct FloorTimes {
  int64_t total = 0, connect = 0, round_trip = 0, import = 0, fd_close = 0, map = 0, access = 0;
  double export_us = 0, exporter_close_us = 0;
};

bool FloorOnce(const RemoteBuffer& b, Op op, const std::string& socket_name, CUdeviceptr va,
               FloorTimes* t, std::string* error) {
  const RealDriver& d = Real();
  const Layout& layout = Layouts()[b.layout];
  const size_t n = layout.chunks.size();
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, socket_name.data(), socket_name.size());
  const socklen_t len =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + socket_name.size());
  Request request;
  request.op = static_cast<uint32_t>(op);
  request.id = b.id;
  Reply reply;
  std::vector<int> fds;

  const int64_t t0 = NowNs();
  const int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (sock < 0 || connect(sock, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    *error = std::string("connect to the floor socket: ") + std::strerror(errno);
    if (sock >= 0) close(sock);
    return false;
  }
  const int64_t t1 = NowNs();
  const bool ok = SendMessage(sock, &request, sizeof(request), nullptr, 0, error) &&
                  ReceiveMessage(sock, &reply, sizeof(reply), &fds,
                                 static_cast<int>(g_opt.timeout_s * 1000), error);
  close(sock);
  const int64_t t2 = NowNs();
  if (!ok || reply.status != CUDA_SUCCESS || fds.size() != n) {
    for (int fd : fds) close(fd);
    if (ok) {
      *error = reply.status != CUDA_SUCCESS
                   ? std::string(reply.text)
                   : "expected " + std::to_string(n) + " fds, got " + std::to_string(fds.size());
    } else if (error->empty()) {
      *error = "the floor exporter closed the connection";
    }
    return false;
  }
  std::vector<CUmemGenericAllocationHandle> handles;
  CUresult r = CUDA_SUCCESS;
  for (size_t i = 0; i < n && r == CUDA_SUCCESS; ++i) {
    CUmemGenericAllocationHandle h = 0;
    r = d.import_shareable(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fds[i])),
                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r == CUDA_SUCCESS) handles.push_back(h);
  }
  if (r != CUDA_SUCCESS) *error = CuFailure(r, "cuMemImportFromShareableHandle");
  const int64_t t3 = NowNs();
  // The import does not take the fd. Timed apart: the last close of an exported fd is where
  // the driver tears its export state down.
  for (int fd : fds) close(fd);
  const int64_t t4 = NowNs();
  size_t mapped = 0;
  uint64_t offset = 0;
  while (r == CUDA_SUCCESS && mapped < n) {
    r = d.map(va + offset, layout.chunks[mapped], 0, handles[mapped], 0);
    if (r != CUDA_SUCCESS) {
      *error = CuFailure(r, "cuMemMap");
      break;
    }
    offset += layout.chunks[mapped++];
  }
  const int64_t t5 = NowNs();
  if (r == CUDA_SUCCESS) {
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = g_opt.cu_device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = d.set_access(va, b.total, &access, 1);
    if (r != CUDA_SUCCESS) *error = CuFailure(r, "cuMemSetAccess");
  }
  const int64_t t6 = NowNs();
  // Untimed clean-up, whatever happened.
  offset = 0;
  for (size_t i = 0; i < mapped; ++i) {
    d.unmap(va + offset, layout.chunks[i]);
    offset += layout.chunks[i];
  }
  for (CUmemGenericAllocationHandle h : handles) d.release(h);
  if (r != CUDA_SUCCESS) return false;
  t->total = t6 - t0;
  t->connect = t1 - t0;
  t->round_trip = t2 - t1;
  t->export_us = reply.us[0];
  t->exporter_close_us = reply.us[1];
  t->import = t3 - t2;
  t->fd_close = t4 - t3;
  t->map = t5 - t4;
  t->access = t6 - t5;
  return true;
}

void BmFloor(benchmark::State& state, const std::string& name, int layout, Op op) {
  Marker(name);
  std::string error, socket_name;
  ExporterClient& fx = ExporterClient::Floor();
  RemoteBuffer b;
  if (!fx.Buffer(layout, true, &b, &error) || !fx.FloorSocket(&socket_name, &error))
    return Fail(state, name, error);
  CUdeviceptr va = 0;
  const CUresult r = Real().address_reserve(&va, b.total, 0, 0, 0);
  if (r != CUDA_SUCCESS) return Fail(state, name, CuFailure(r, "cuMemAddressReserve"));
  FloorTimes t;
  // Warm-up, untimed: it also sets the exporter's state up (the kept fd, the anchor, or
  // nothing alive).
  if (!FloorOnce(b, op, socket_name, va, &t, &error)) {
    Real().address_free(va, b.total);
    return Fail(state, name, "warm-up: " + error);
  }
  Samples total, connect_s, exported, transfer, import, fd_close, map, access, exporter_close;
  for (auto _ : state) {
    if (!FloorOnce(b, op, socket_name, va, &t, &error)) {
      Fail(state, name, error);
      break;
    }
    state.SetIterationTime(static_cast<double>(t.total) * 1e-9);
    total.AddNs(t.total);
    connect_s.AddNs(t.connect);
    exported.Add(t.export_us * 1e-6);
    // The round trip less the export: request, wake-up, SCM_RIGHTS transfer, reply.
    transfer.Add(std::max(0.0, static_cast<double>(t.round_trip) * 1e-9 - t.export_us * 1e-6));
    import.AddNs(t.import);
    fd_close.AddNs(t.fd_close);
    map.AddNs(t.map);
    access.AddNs(t.access);
    exporter_close.Add(t.exporter_close_us * 1e-6);
  }
  Real().address_free(va, b.total);
  TimeCounters(state, total, "");
  if (total.empty()) return;
  state.counters["connect_us"] = connect_s.MedianUs();
  state.counters["export_us"] = exported.MedianUs();
  state.counters["transfer_us"] = transfer.MedianUs();
  state.counters["import_us"] = import.MedianUs();
  state.counters["fd_close_us"] = fd_close.MedianUs();
  state.counters["map_us"] = map.MedianUs();
  state.counters["access_us"] = access.MedianUs();
  state.counters["exporter_close_us"] = exporter_close.MedianUs();
  state.counters["chunks"] = static_cast<double>(Layouts()[layout].chunks.size());
}

// ---- data path -----------------------------------------------------------------------------

void BandwidthCounters(benchmark::State& state, const Samples& s, uint64_t bytes) {
  TimeCounters(state, s, "");
  if (s.empty()) return;
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
  state.counters["GBps"] = static_cast<double>(bytes) / (s.MedianUs() * 1e-6) / 1e9;
}

// cuMemcpyDtoD of the whole buffer in the exporter, on its own mapping, into a
// scratch buffer of its own, synchronised; timed by the exporter.
void BmBandwidthLocal(benchmark::State& state, const std::string& name, int layout, bool vmm) {
  RemoteBuffer b;
  Samples s;
  if (TimeInExporter(state, name, layout, vmm, Op::kCopy, &b, &s))
    BandwidthCounters(state, s, b.total);
}

// The same copy in the importer, from its imported mapping into a scratch buffer.
void BmBandwidthImported(benchmark::State& state, const std::string& name, int layout, bool vmm) {
  Marker(name);
  std::string error;
  RemoteBuffer b;
  if (!ExporterClient::Instance().Buffer(layout, vmm, &b, &error)) return Fail(state, name, error);
  CUdeviceptr dst = 0;
  if (!Scratch(b.total, &dst, &error)) return Fail(state, name, error);
  CUipcMemHandle handle;
  CUdeviceptr src = 0;
  if (!OpenChecked(b, &handle, &src, &error)) return Fail(state, name, error);
  CUresult r = cuMemcpyDtoD(dst, src, b.total);
  if (r == CUDA_SUCCESS) r = cuCtxSynchronize();
  Samples s;
  if (r != CUDA_SUCCESS) {
    Fail(state, name, CuFailure(r, "cuMemcpyDtoD (warm-up)"));
  } else {
    for (auto _ : state) {
      const int64_t t0 = NowNs();
      r = cuMemcpyDtoD(dst, src, b.total);
      if (r == CUDA_SUCCESS) r = cuCtxSynchronize();
      const int64_t t1 = NowNs();
      if (r != CUDA_SUCCESS) {
        Fail(state, name, CuFailure(r, "cuMemcpyDtoD + cuCtxSynchronize"));
        break;
      }
      state.SetIterationTime(static_cast<double>(t1 - t0) * 1e-9);
      s.AddNs(t1 - t0);
    }
  }
  r = cuIpcCloseMemHandle(src);
  if (r != CUDA_SUCCESS) Fail(state, name, CuFailure(r, "cuIpcCloseMemHandle"));
  BandwidthCounters(state, s, b.total);
}

// ---- pieces seen from outside the hook -----------------------------------------------------

// One request/reply on the established channel to the exporter.
void BmPing(benchmark::State& state, const std::string& name) {
  Marker(name);
  std::string error;
  ExporterClient& ex = ExporterClient::Instance();
  Request request;
  request.op = static_cast<uint32_t>(Op::kPing);
  Reply reply;
  if (!ex.Call(request, &reply, nullptr, &error)) return Fail(state, name, error);
  Samples s;
  for (auto _ : state) {
    const int64_t t0 = NowNs();
    const bool ok = ex.Call(request, &reply, nullptr, &error);
    const int64_t t1 = NowNs();
    if (!ok) {
      Fail(state, name, error);
      break;
    }
    state.SetIterationTime(static_cast<double>(t1 - t0) * 1e-9);
    s.AddNs(t1 - t0);
  }
  TimeCounters(state, s, "");
}

// connect() to an abstract Unix socket the exporter serves (as vmmipc's
// importer connects to "\0vmmipc.<uid>.<pid>"), one byte each way, close.
void BmConnect(benchmark::State& state, const std::string& name) {
  Marker(name);
  std::string error;
  ExporterClient& ex = ExporterClient::Instance();
  Request request;
  request.op = static_cast<uint32_t>(Op::kProbeStart);
  Reply reply;
  if (!ex.Call(request, &reply, nullptr, &error) || reply.status != CUDA_SUCCESS)
    return Fail(state, name, error.empty() ? reply.text : error);
  const std::string probe = reply.text;
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, probe.data(), probe.size());
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + probe.size());
  auto once = [&]() -> bool {
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      error = std::string("socket: ") + std::strerror(errno);
      return false;
    }
    bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0;
    if (!ok) error = std::string("connect: ") + std::strerror(errno);
    char byte = 1;
    if (ok && write(fd, &byte, 1) != 1) {
      ok = false;
      error = "write to the probe failed";
    }
    pollfd p = {fd, POLLIN, 0};
    if (ok && (poll(&p, 1, 5000) != 1 || read(fd, &byte, 1) != 1)) {
      ok = false;
      error = "no echo from the probe within 5 s";
    }
    close(fd);
    return ok;
  };
  if (!once()) return Fail(state, name, error);
  Samples s;
  for (auto _ : state) {
    const int64_t t0 = NowNs();
    const bool ok = once();
    const int64_t t1 = NowNs();
    if (!ok) {
      Fail(state, name, error);
      break;
    }
    state.SetIterationTime(static_cast<double>(t1 - t0) * 1e-9);
    s.AddNs(t1 - t0);
  }
  TimeCounters(state, s, "");
}

// ---- load cost -----------------------------------------------------------------------------

struct ChildResult {
  double seconds = 0;
  int threads_at_main = -1;
  int threads_after = -1;
};

bool IsVmmipcEntry(const std::string& entry) { return entry.find("vmmipc") != std::string::npos; }

// The environment without vmmipc in LD_PRELOAD, or with `preload` as LD_PRELOAD.
std::vector<std::string> ChildEnv(const std::vector<std::string>& env, const std::string& preload) {
  std::vector<std::string> out;
  for (const std::string& e : env) {
    if (e.rfind("LD_PRELOAD=", 0) != 0) {
      out.push_back(e);
      continue;
    }
    if (!preload.empty()) continue;  // replaced below
    std::string kept, entry;
    for (char c : e.substr(11) + ":") {
      if (c == ':' || c == ' ') {
        if (!entry.empty() && !IsVmmipcEntry(entry)) kept += (kept.empty() ? "" : ":") + entry;
        entry.clear();
      } else {
        entry += c;
      }
    }
    if (!kept.empty()) out.push_back("LD_PRELOAD=" + kept);
  }
  if (!preload.empty()) out.push_back("LD_PRELOAD=" + preload);
  return out;
}

// Waits for `pid` at most timeout_ms; a pidfd wakes up exactly at the exit.
bool WaitChild(pid_t pid, int timeout_ms, int* status, std::string* error) {
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd >= 0) {
    pollfd p = {pidfd, POLLIN, 0};
    int r;
    do {
      r = poll(&p, 1, timeout_ms);
    } while (r < 0 && errno == EINTR);
    close(pidfd);
    if (r == 0) {
      kill(pid, SIGKILL);
      waitpid(pid, status, 0);
      *error = "child did not exit within " + std::to_string(timeout_ms) + " ms";
      return false;
    }
  }
  pid_t r;
  do {
    r = waitpid(pid, status, 0);
  } while (r < 0 && errno == EINTR);
  if (r != pid) {
    *error = std::string("waitpid: ") + std::strerror(errno);
    return false;
  }
  return true;
}

bool SpawnChild(const std::string& mode, const std::vector<std::string>& env, ChildResult* out,
                std::string* error) {
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    *error = std::string("pipe2: ") + std::strerror(errno);
    return false;
  }
  std::vector<std::string> args = {g_opt.self_exe, "--vmmipc_child=" + mode};
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_copy = env;
  for (auto& e : env_copy) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  pid_t pid = -1;
  const int64_t t0 = NowNs();
  const int rc =
      posix_spawn(&pid, g_opt.self_exe.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fds[1]);
  if (rc != 0) {
    close(pipe_fds[0]);
    *error = "posix_spawn: " + std::string(std::strerror(rc));
    return false;
  }
  SetTransientChild(pid);
  int status = 0;
  const bool waited = WaitChild(pid, static_cast<int>(g_opt.timeout_s * 1000), &status, error);
  const int64_t t1 = NowNs();
  SetTransientChild(-1);
  std::string text;
  char buf[256];
  ssize_t n;
  while ((n = read(pipe_fds[0], buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(n));
  close(pipe_fds[0]);
  if (!waited) return false;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    *error = "child '" + mode + "' failed (status " + std::to_string(status) + "): " + text;
    return false;
  }
  out->seconds = static_cast<double>(t1 - t0) * 1e-9;
  std::sscanf(text.c_str(), "threads_at_main=%d threads_after=%d", &out->threads_at_main,
              &out->threads_after);
  return true;
}

// Time from posix_spawn to the exit of a child that exits at once ("exit") or
// after cuInit ("cuinit"); with a known preload, samples alternate between the
// environment without vmmipc and with it, so drift hits both alike.
void BmLoad(benchmark::State& state, const std::string& name, const std::string& mode) {
  Marker(name);
  const bool with_preload = !g_opt.preload.empty();
  const std::vector<std::string> env_without = ChildEnv(g_opt.env, "");
  const std::vector<std::string> env_with = ChildEnv(g_opt.env, g_opt.preload);
  std::string error;
  for (auto _ : state) {
    Samples without, with;
    std::vector<double> deltas;
    int threads_main_without = 0, threads_main_with = 0, threads_after_without = 0,
        threads_after_with = 0;
    const int64_t start = NowNs();
    bool ok = true;
    for (int i = 0; ok && i < std::max(3, g_opt.load_samples); ++i) {
      if (i >= 3 && static_cast<double>(NowNs() - start) * 1e-9 > g_opt.load_budget_s) break;
      ChildResult a, b;
      if (with_preload && i % 2 == 1) {
        ok = SpawnChild(mode, env_with, &b, &error) && SpawnChild(mode, env_without, &a, &error);
      } else {
        ok = SpawnChild(mode, env_without, &a, &error) &&
             (!with_preload || SpawnChild(mode, env_with, &b, &error));
      }
      if (!ok) break;
      without.Add(a.seconds);
      threads_main_without = std::max(threads_main_without, a.threads_at_main);
      threads_after_without = std::max(threads_after_without, a.threads_after);
      if (with_preload) {
        with.Add(b.seconds);
        deltas.push_back(b.seconds - a.seconds);
        threads_main_with = std::max(threads_main_with, b.threads_at_main);
        threads_after_with = std::max(threads_after_with, b.threads_after);
      }
    }
    if (!ok) {
      Fail(state, name, error);
      break;
    }
    state.SetIterationTime((with_preload ? with : without).MedianUs() * 1e-6);
    state.counters["nopreload_us"] = without.MedianUs();
    state.counters["nopreload_threads_at_main"] = threads_main_without;
    state.counters["nopreload_threads_after"] = threads_after_without;
    state.counters["samples"] = static_cast<double>(without.size());
    if (with_preload) {
      state.counters["preload_us"] = with.MedianUs();
      state.counters["delta_us"] = Median(deltas) * 1e6;
      state.counters["preload_threads_at_main"] = threads_main_with;
      state.counters["preload_threads_after"] = threads_after_with;
    }
  }
}

// ---- registration --------------------------------------------------------------------------

void Add(const std::string& name, int64_t iterations,
         std::function<void(benchmark::State&, const std::string&)> body) {
  benchmark::RegisterBenchmark(name.c_str(),
                               [body, name](benchmark::State& state) { body(state, name); })
      ->UseManualTime()
      ->Iterations(iterations)
      ->Unit(benchmark::kMicrosecond);
}

}  // namespace

// Registration order is run order: the cheap benchmarks first.
void RegisterBenchmarks(const Options& options) {
  g_opt = options;
  using S = benchmark::State;
  using N = const std::string;
  const auto& layouts = Layouts();
  const bool hooks = options.hooks_active;

  Add("load/exit", 1, [](S& s, N& n) { BmLoad(s, n, "exit"); });
  Add("load/cuinit", 1, [](S& s, N& n) { BmLoad(s, n, "cuinit"); });

  Add("passthrough/cuIpcGetMemHandle/linked", Iters(5000),
      [](S& s, N& n) { BmGet(s, n, 0, false, &cuIpcGetMemHandle); });
  Add("passthrough/cuIpcGetMemHandle/real", Iters(5000),
      [](S& s, N& n) { BmGet(s, n, 0, false, Real().ipc_get_mem_handle); });
  Add("passthrough/cuPointerGetAttribute/linked", Iters(5000),
      [](S& s, N& n) { BmAttribute(s, n, &cuPointerGetAttribute); });
  Add("passthrough/cuPointerGetAttribute/real", Iters(5000),
      [](S& s, N& n) { BmAttribute(s, n, Real().pointer_get_attribute); });

  for (int i = 0; i < static_cast<int>(layouts.size()); ++i) {
    const std::string& size = layouts[i].name;
    if (layouts[i].legacy_too)
      Add("get/legacy/" + size, Iters(2000), [i](S& s, N& n) { BmGetInExporter(s, n, i, false); });
    if (hooks)
      Add("get/vmmipc/" + size, Iters(2000), [i](S& s, N& n) { BmGetInExporter(s, n, i, true); });
  }
  for (int i = 0; i < static_cast<int>(layouts.size()); ++i) {
    const std::string& size = layouts[i].name;
    if (layouts[i].legacy_too)
      Add("reopen/legacy/" + size, Iters(1000), [i](S& s, N& n) { BmReopen(s, n, i, false); });
    if (hooks)
      Add("reopen/vmmipc/" + size, Iters(1000), [i](S& s, N& n) { BmReopen(s, n, i, true); });
  }
  for (int i = 0; i < static_cast<int>(layouts.size()); ++i) {
    const std::string& size = layouts[i].name;
    Add("bandwidth/local/" + size, Iters(30), [i](S& s, N& n) { BmBandwidthLocal(s, n, i, true); });
    if (hooks)
      Add("bandwidth/imported/" + size, Iters(30),
          [i](S& s, N& n) { BmBandwidthImported(s, n, i, true); });
    if (layouts[i].legacy_too) {
      Add("bandwidth/legacy_local/" + size, Iters(30),
          [i](S& s, N& n) { BmBandwidthLocal(s, n, i, false); });
      Add("bandwidth/legacy_imported/" + size, Iters(30),
          [i](S& s, N& n) { BmBandwidthImported(s, n, i, false); });
    }
  }
  Add("piece/ping", Iters(2000), [](S& s, N& n) { BmPing(s, n); });
  Add("piece/connect", Iters(500), [](S& s, N& n) { BmConnect(s, n); });
  // The first opens last: they cost the most, and a run cut short by its time limit keeps the rest.
  for (int i = 0; i < static_cast<int>(layouts.size()); ++i) {
    const std::string& size = layouts[i].name;
    const double opens = layouts[i].chunks.size() > 1 ? 40 : 100;
    if (layouts[i].legacy_too)
      Add("open/legacy/" + size, Iters(opens), [i](S& s, N& n) { BmOpen(s, n, i, false); });
    if (hooks) Add("open/vmmipc/" + size, Iters(opens), [i](S& s, N& n) { BmOpen(s, n, i, true); });
    // A fresh 2 MiB buffer per iteration: the other layouts would allocate 1 GiB each time.
    if (hooks && i == 0)
      Add("open_fresh/vmmipc/" + size, Iters(opens), [i](S& s, N& n) { BmOpenFresh(s, n, i); });
    Add("floor/" + size, Iters(opens), [i](S& s, N& n) { BmFloor(s, n, i, Op::kFloorDup); });
    Add("floor_fresh/" + size, Iters(opens),
        [i](S& s, N& n) { BmFloor(s, n, i, Op::kFloorFresh); });
    Add("cliff/" + size, Iters(opens), [i](S& s, N& n) { BmFloor(s, n, i, Op::kFloorCliff); });
  }
}

void ReleaseBenchmarkResources() {
  for (auto& [key, buffer] : g_local) FreeBuffer(&buffer);
  g_local.clear();
  if (g_scratch != 0) cuMemFree(g_scratch);
  g_scratch = 0;
  g_scratch_size = 0;
  ExporterClient::Instance().Stop();
  ExporterClient::Floor().Stop();
}

bool AnyBenchmarkFailed() { return g_failed; }

int LoadChildMain(const std::string& mode) {
  const int at_main = CountThreads();
  int after = at_main;
  if (mode == "cuinit") {
    const CUresult r = cuInit(0);
    if (r != CUDA_SUCCESS) {
      std::printf("cuInit failed: %s\n", CuErrorText(r).c_str());
      return 1;
    }
    after = CountThreads();
  } else if (mode != "exit") {
    std::printf("unknown child mode %s\n", mode.c_str());
    return 2;
  }
  std::printf("threads_at_main=%d threads_after=%d\n", at_main, after);
  return 0;
}

}  // namespace vmmipc_bench
