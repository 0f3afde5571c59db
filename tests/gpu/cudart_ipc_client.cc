// cudart_ipc_client: a real libcudart client of vmmipc, for the GPU machine.
// `parent` allocates VMM memory with the driver API (two granularity chunks mapped back to
// back in one reservation), exports it with cudaIpcGetMemHandle (base and an interior address
// in the second chunk) plus one cudaMalloc buffer as a pass-through control, and spawns itself
// as `child`, which opens the handles with cudaIpcOpenMemHandle, checks the data across the chunk
// boundary, writes a reply and closes. Run it with LD_PRELOAD=libvmmipc.so.
// `parent --expect-unhooked` records the baseline without vmmipc (the driver refuses VMM memory).
// Every check prints `CHECK <role>.<name> PASS|FAIL <detail>`. Exit: 0 pass, 1 fail, 77 skip.
// It never links vmmipc: the preload is the only way the hooks get in, as for a real user.

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace {

constexpr int kExitPass = 0;
constexpr int kExitFail = 1;
constexpr int kExitSkip = 77;
constexpr int kExitUsage = 2;

// The interior handle is taken at granularity + kInteriorOffset: inside the second chunk, and
// not chunk aligned, so the importer must honour the exact address that get was given.
constexpr size_t kInteriorOffset = 4096;
constexpr size_t kLegacyBytes = 2 << 20;  // the cudaMalloc pass-through control buffer
constexpr int kChildTimeoutSeconds = 90;

// Pattern seeds. Offsets are always absolute byte offsets in the buffer, so the writer and the
// checker agree whatever pointer they write through.
constexpr uint32_t kSeedOriginal = 1;
constexpr uint32_t kSeedReplyFirstChunk = 2;
constexpr uint32_t kSeedReplySecondChunk = 3;
constexpr uint32_t kSeedLegacyOriginal = 4;
constexpr uint32_t kSeedLegacyReply = 5;

using Clock = std::chrono::steady_clock;

double MicrosSince(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

std::string Hex(uint64_t value) {
  char text[32];
  std::snprintf(text, sizeof(text), "0x%" PRIx64, value);
  return text;
}

std::string RtName(cudaError_t err) {
  const char* name = cudaGetErrorName(err);
  return std::string(name != nullptr ? name : "cudaError?") + "(" + std::to_string(err) + ")";
}

std::string DrvName(CUresult res) {
  const char* name = nullptr;
  if (cuGetErrorName(res, &name) != CUDA_SUCCESS || name == nullptr) name = "CUresult?";
  return std::string(name) + "(" + std::to_string(res) + ")";
}

// Records and prints every check; a role ("parent", "child", "baseline") prefixes the names.
class Checks {
 public:
  explicit Checks(std::string role) : role_(std::move(role)) {}

  bool Expect(bool ok, const std::string& name, const std::string& detail) {
    std::printf("CHECK %s.%s %s %s\n", role_.c_str(), name.c_str(), ok ? "PASS" : "FAIL",
                detail.c_str());
    std::fflush(stdout);
    ++total_;
    if (!ok) ++failed_;
    return ok;
  }

  void Info(const std::string& text) {
    std::printf("[%s] %s\n", role_.c_str(), text.c_str());
    std::fflush(stdout);
  }

  // Prints the closing line and returns the exit code.
  int Finish() {
    std::printf("RESULT %s %s: %d checks, %d failed\n", role_.c_str(),
                failed_ == 0 ? "PASS" : "FAIL", total_, failed_);
    std::fflush(stdout);
    return failed_ == 0 ? kExitPass : kExitFail;
  }

  int failed() const { return failed_; }

 private:
  std::string role_;
  int total_ = 0;
  int failed_ = 0;
};

// --- patterns --------------------------------------------------------------------------------

uint32_t PatternWord(uint32_t seed, uint64_t word_index) {
  uint64_t x = word_index * 0x9E3779B97F4A7C15ull + seed * 0xD1B54A32D192ED03ull + 1;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<uint32_t>(x);
}

// Fills `bytes` bytes (a multiple of 4) as the pattern at absolute byte offset `offset`.
std::vector<uint32_t> MakePattern(uint32_t seed, size_t offset, size_t bytes) {
  std::vector<uint32_t> words(bytes / 4);
  for (size_t i = 0; i < words.size(); ++i) words[i] = PatternWord(seed, offset / 4 + i);
  return words;
}

// Compares device-read words with the pattern; returns "" when equal, else what differs.
std::string ComparePattern(const std::vector<uint32_t>& got, uint32_t seed, size_t offset) {
  size_t mismatches = 0;
  size_t first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != PatternWord(seed, offset / 4 + i)) {
      if (mismatches++ == 0) first = i;
    }
  }
  if (mismatches == 0) return "";
  char text[256];
  std::snprintf(text, sizeof(text),
                "%zu of %zu words differ; first at byte offset %s: expected 0x%08x got 0x%08x "
                "(seed %u)",
                mismatches, got.size(), Hex(offset + first * 4).c_str(),
                PatternWord(seed, offset / 4 + first), got[first], seed);
  return text;
}

// Writes the pattern through `device` (which stands for absolute offset `offset`).
cudaError_t WritePattern(void* device, uint32_t seed, size_t offset, size_t bytes) {
  std::vector<uint32_t> words = MakePattern(seed, offset, bytes);
  return cudaMemcpy(device, words.data(), bytes, cudaMemcpyHostToDevice);
}

// Reads `bytes` through `device` and compares with the pattern at absolute `offset`.
// Returns "" on a match, else a description (copy error or mismatch).
std::string ReadAndCompare(const void* device, uint32_t seed, size_t offset, size_t bytes) {
  std::vector<uint32_t> got(bytes / 4, 0);
  cudaError_t err = cudaMemcpy(got.data(), device, bytes, cudaMemcpyDeviceToHost);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return "cudaMemcpy(DtoH) failed: " + RtName(err);
  }
  return ComparePattern(got, seed, offset);
}

// --- handles on argv ----------------------------------------------------------------------

std::string HandleToHex(const cudaIpcMemHandle_t& handle) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < sizeof(handle.reserved); ++i) {
    const auto byte = static_cast<unsigned char>(handle.reserved[i]);
    out.push_back(kDigits[byte >> 4]);
    out.push_back(kDigits[byte & 15]);
  }
  return out;
}

bool HexToHandle(const std::string& text, cudaIpcMemHandle_t* handle) {
  if (text.size() != 2 * sizeof(handle->reserved)) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < sizeof(handle->reserved); ++i) {
    const int hi = nibble(text[2 * i]);
    const int lo = nibble(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    handle->reserved[i] = static_cast<char>(hi << 4 | lo);
  }
  return true;
}

bool ParseU64(const char* text, uint64_t* value) {
  if (text == nullptr || *text == '\0') return false;
  errno = 0;
  char* end = nullptr;
  const unsigned long long parsed = std::strtoull(text, &end, 0);
  if (errno != 0 || end == nullptr || *end != '\0') return false;
  *value = parsed;
  return true;
}

// --- environment -----------------------------------------------------------------------------

// True when libvmmipc is mapped into this process (LD_PRELOAD took effect).
bool VmmipcLoaded() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("libvmmipc") != std::string::npos) return true;
  }
  return false;
}

std::string EnvOr(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : fallback;
}

// vmmipc's rank for this exporter: VMMIPC_RANK, LOCAL_RANK, RANK (docs/configuration.md).
bool ExporterIsRanked() {
  for (const char* name : {"VMMIPC_RANK", "LOCAL_RANK", "RANK"}) {
    uint64_t rank = 0;
    const char* value = std::getenv(name);
    if (value != nullptr && ParseU64(value, &rank)) return true;
  }
  return false;
}

// Selects the device, prints what it is, and makes the primary context current.
// Returns kExitPass, or kExitSkip / kExitFail with the reason printed.
int InitDevice(Checks& checks, int device) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("SKIP: no CUDA device (cudaGetDeviceCount: %s, count %d)\n", RtName(err).c_str(),
                count);
    return kExitSkip;
  }
  if (device >= count) {
    std::printf("SKIP: no CUDA device %d (count %d)\n", device, count);
    return kExitSkip;
  }
  int runtime_version = 0;
  int driver_version = 0;
  cudaRuntimeGetVersion(&runtime_version);
  cudaDriverGetVersion(&driver_version);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, device);
  checks.Info("device " + std::to_string(device) + ": " + prop.name + ", cudart " +
              std::to_string(runtime_version) + ", driver API " + std::to_string(driver_version) +
              ", pid " + std::to_string(getpid()));
  if ((err = cudaSetDevice(device)) != cudaSuccess || (err = cudaFree(nullptr)) != cudaSuccess) {
    checks.Expect(false, "init_device", "cudaSetDevice/cudaFree(0): " + RtName(err));
    return kExitFail;
  }
  CUcontext ctx = nullptr;
  const CUresult res = cuCtxGetCurrent(&ctx);
  if (res != CUDA_SUCCESS || ctx == nullptr) {
    checks.Expect(false, "init_device", "no current context after cudaFree(0): " + DrvName(res));
    return kExitFail;
  }
  return kExitPass;
}

// --- the VMM buffer (parent) -----------------------------------------------------------------

// Two chunks of `granularity` bytes mapped back to back in one reservation, POSIX-fd exportable.
class VmmBuffer {
 public:
  VmmBuffer() = default;
  VmmBuffer(const VmmBuffer&) = delete;
  VmmBuffer& operator=(const VmmBuffer&) = delete;
  ~VmmBuffer() { Release(nullptr); }

  // Returns "" on success, else what failed.
  std::string Create(int device) {
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = device;
    prop_.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUresult res =
        cuMemGetAllocationGranularity(&granularity_, &prop_, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (res != CUDA_SUCCESS) return "cuMemGetAllocationGranularity: " + DrvName(res);
    if ((res = cuMemAddressReserve(&base_, 2 * granularity_, 0, 0, 0)) != CUDA_SUCCESS) {
      base_ = 0;
      return "cuMemAddressReserve: " + DrvName(res);
    }
    for (int i = 0; i < 2; ++i) {
      if ((res = cuMemCreate(&chunks_[i], granularity_, &prop_, 0)) != CUDA_SUCCESS) {
        return "cuMemCreate(chunk " + std::to_string(i) + "): " + DrvName(res);
      }
      created_[i] = true;
      if ((res = cuMemMap(base_ + i * granularity_, granularity_, 0, chunks_[i], 0)) !=
          CUDA_SUCCESS) {
        return "cuMemMap(chunk " + std::to_string(i) + "): " + DrvName(res);
      }
      mapped_[i] = true;
    }
    CUmemAccessDesc access{};
    access.location = prop_.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if ((res = cuMemSetAccess(base_, 2 * granularity_, &access, 1)) != CUDA_SUCCESS) {
      return "cuMemSetAccess: " + DrvName(res);
    }
    return "";
  }

  // Unmaps, releases and frees; `error` (if given) gets the first failure, "" when clean.
  void Release(std::string* error) {
    std::string first;
    auto note = [&first](const std::string& what, CUresult res) {
      if (res != CUDA_SUCCESS && first.empty()) first = what + ": " + DrvName(res);
    };
    for (int i = 0; i < 2; ++i) {
      if (mapped_[i]) note("cuMemUnmap", cuMemUnmap(base_ + i * granularity_, granularity_));
      if (created_[i]) note("cuMemRelease", cuMemRelease(chunks_[i]));
      mapped_[i] = created_[i] = false;
    }
    if (base_ != 0) note("cuMemAddressFree", cuMemAddressFree(base_, 2 * granularity_));
    base_ = 0;
    if (error != nullptr) *error = first;
  }

  CUdeviceptr base() const { return base_; }
  size_t granularity() const { return granularity_; }
  size_t bytes() const { return 2 * granularity_; }
  void* ptr(size_t offset) const { return reinterpret_cast<void*>(base_ + offset); }

 private:
  CUmemAllocationProp prop_{};
  size_t granularity_ = 0;
  CUdeviceptr base_ = 0;
  CUmemGenericAllocationHandle chunks_[2] = {0, 0};
  bool created_[2] = {false, false};
  bool mapped_[2] = {false, false};
};

// SKIP unless the device can do VMM with POSIX fds (docs/driver-behaviour.md: the H200 can).
bool DeviceSupportsVmmFds(int device, std::string* why) {
  CUdevice dev = 0;
  int vmm = 0;
  int fds = 0;
  CUresult res = cuDeviceGet(&dev, device);
  if (res == CUDA_SUCCESS) {
    res = cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
  }
  if (res == CUDA_SUCCESS) {
    res = cuDeviceGetAttribute(
        &fds, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev);
  }
  if (res != CUDA_SUCCESS) {
    *why = "cuDeviceGetAttribute: " + DrvName(res);
    return false;
  }
  if (vmm == 0 || fds == 0) {
    *why = "VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED=" + std::to_string(vmm) +
           " HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED=" + std::to_string(fds);
    return false;
  }
  return true;
}

std::string IpcCapable(CUdeviceptr ptr, int* value) {
  *value = 0;  // the driver may write a one-byte bool: keep the rest zero
  const CUresult res =
      cuPointerGetAttribute(value, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, ptr);
  return res == CUDA_SUCCESS ? "" : DrvName(res);
}

// Explains a failed get, so a missing preload is obvious in the log.
std::string GetFailureHint(cudaError_t err) {
  if (err != cudaErrorInvalidValue) return "";
  if (!VmmipcLoaded()) {
    return "; this is what the unhooked driver answers for VMM memory: libvmmipc.so is NOT "
           "loaded (LD_PRELOAD='" +
           EnvOr("LD_PRELOAD", "") + "')";
  }
  return "; libvmmipc.so is loaded but the call reached the driver unhooked or was refused "
         "(see the vmmipc log lines above)";
}

// --- child -----------------------------------------------------------------------------------

// argv: child <device> <granularity> <ranked 0|1> <hex base> <hex interior> <hex legacy>
int RunChild(int argc, char** argv) {
  Checks checks("child");
  uint64_t device = 0;
  uint64_t granularity = 0;
  uint64_t ranked = 0;
  cudaIpcMemHandle_t handle_base{};
  cudaIpcMemHandle_t handle_interior{};
  cudaIpcMemHandle_t handle_legacy{};
  if (argc != 8 || !ParseU64(argv[2], &device) || !ParseU64(argv[3], &granularity) ||
      !ParseU64(argv[4], &ranked) || !HexToHandle(argv[5], &handle_base) ||
      !HexToHandle(argv[6], &handle_interior) || !HexToHandle(argv[7], &handle_legacy) ||
      granularity < 2 * kInteriorOffset || granularity % 4 != 0) {
    std::fprintf(stderr,
                 "usage: %s child <device> <granularity> <ranked 0|1> <hex base> "
                 "<hex interior> <hex legacy> (128 hex digits each)\n",
                 argv[0]);
    return kExitUsage;
  }
  checks.Info("vmmipc loaded: " + std::string(VmmipcLoaded() ? "yes" : "NO") +
              ", VMMIPC_RANK=" + EnvOr("VMMIPC_RANK", "(unset)"));
  const int init = InitDevice(checks, static_cast<int>(device));
  if (init != kExitPass) return init == kExitSkip ? kExitFail : init;  // the parent saw a GPU

  const size_t total = 2 * granularity;
  const size_t interior = granularity + kInteriorOffset;
  constexpr unsigned int kFlags = cudaIpcMemLazyEnablePeerAccess;

  // Open the three handles.
  void* base = nullptr;
  void* inner = nullptr;
  void* legacy = nullptr;
  auto open_handle = [&](const char* name, const cudaIpcMemHandle_t& handle, void** out) {
    const auto start = Clock::now();
    const cudaError_t err = cudaIpcOpenMemHandle(out, handle, kFlags);
    const double micros = MicrosSince(start);
    if (err != cudaSuccess) {
      cudaGetLastError();
      *out = nullptr;
    }
    char detail[160];
    std::snprintf(detail, sizeof(detail), "%s -> %s in %.0f us", RtName(err).c_str(),
                  Hex(reinterpret_cast<uintptr_t>(*out)).c_str(), micros);
    return checks.Expect(err == cudaSuccess, std::string("open_") + name, detail);
  };
  open_handle("base", handle_base, &base);
  open_handle("interior", handle_interior, &inner);
  open_handle("legacy", handle_legacy, &legacy);

  if (base != nullptr && inner != nullptr) {
    const auto delta = reinterpret_cast<uintptr_t>(inner) - reinterpret_cast<uintptr_t>(base);
    const std::string detail = "interior - base = " + Hex(delta) + ", exporter's " + Hex(interior) +
                               (ranked != 0 ? "" : " (unranked: not required)");
    if (ranked != 0) {
      checks.Expect(delta == interior, "interior_offset_preserved", detail);
    } else {
      checks.Info("interior_offset " + detail);
    }
  }

  if (base != nullptr) {
    cudaPointerAttributes attrs{};
    const cudaError_t err = cudaPointerGetAttributes(&attrs, base);
    if (err != cudaSuccess) cudaGetLastError();
    checks.Expect(err == cudaSuccess && attrs.type == cudaMemoryTypeDevice &&
                      attrs.device == static_cast<int>(device),
                  "pointer_attributes",
                  RtName(err) + " type " + std::to_string(attrs.type) + " device " +
                      std::to_string(attrs.device));
    const std::string diff = ReadAndCompare(base, kSeedOriginal, 0, total);
    checks.Expect(diff.empty(), "read_base_across_chunk_boundary",
                  diff.empty() ? Hex(total) + " bytes match through the base pointer" : diff);
  }
  if (inner != nullptr) {
    const std::string diff = ReadAndCompare(inner, kSeedOriginal, interior, total - interior);
    checks.Expect(
        diff.empty(), "read_interior",
        diff.empty() ? Hex(total - interior) + " bytes match from the interior pointer" : diff);
  }
  if (legacy != nullptr) {
    const std::string diff = ReadAndCompare(legacy, kSeedLegacyOriginal, 0, kLegacyBytes);
    checks.Expect(diff.empty(), "read_legacy",
                  diff.empty() ? "cudaMalloc buffer matches (pass-through)" : diff);
  }

  // Same handle twice: same pointer, reference counted (docs/driver-behaviour.md).
  if (base != nullptr) {
    void* again = nullptr;
    const cudaError_t err = cudaIpcOpenMemHandle(&again, handle_base, kFlags);
    if (err != cudaSuccess) cudaGetLastError();
    checks.Expect(err == cudaSuccess && again == base, "open_twice_same_pointer",
                  RtName(err) + " -> " + Hex(reinterpret_cast<uintptr_t>(again)) + ", first " +
                      Hex(reinterpret_cast<uintptr_t>(base)));
    if (err == cudaSuccess) {
      const cudaError_t close_err = cudaIpcCloseMemHandle(again);
      if (close_err != cudaSuccess) cudaGetLastError();
      checks.Expect(close_err == cudaSuccess, "close_first_of_two", RtName(close_err));
      const size_t window = granularity - kInteriorOffset;  // straddles the chunk boundary
      const std::string diff = ReadAndCompare(static_cast<char*>(base) + window, kSeedOriginal,
                                              window, 2 * kInteriorOffset);
      checks.Expect(diff.empty(), "readable_after_first_close",
                    diff.empty() ? "the chunk-boundary window still reads back" : diff);
    }
  }

  // Reply: first chunk through the base pointer, the rest of the second chunk through the
  // interior pointer; [granularity, interior) stays as the parent wrote it.
  if (base != nullptr) {
    const cudaError_t err = WritePattern(base, kSeedReplyFirstChunk, 0, granularity);
    checks.Expect(err == cudaSuccess, "write_reply_first_chunk", RtName(err));
  }
  if (inner != nullptr) {
    const cudaError_t err = WritePattern(inner, kSeedReplySecondChunk, interior, total - interior);
    checks.Expect(err == cudaSuccess, "write_reply_interior", RtName(err));
  }
  if (legacy != nullptr) {
    const cudaError_t err = WritePattern(legacy, kSeedLegacyReply, 0, kLegacyBytes);
    checks.Expect(err == cudaSuccess, "write_reply_legacy", RtName(err));
  }
  const cudaError_t sync = cudaDeviceSynchronize();
  checks.Expect(sync == cudaSuccess, "synchronize", RtName(sync));

  auto close_handle = [&](const char* name, void* ptr) {
    if (ptr == nullptr) return;
    const cudaError_t err = cudaIpcCloseMemHandle(ptr);
    if (err != cudaSuccess) cudaGetLastError();
    checks.Expect(err == cudaSuccess, std::string("close_") + name, RtName(err));
  };
  close_handle("interior", inner);
  close_handle("base", base);
  close_handle("legacy", legacy);
  if (base != nullptr) {
    const cudaError_t err = cudaIpcCloseMemHandle(base);
    cudaGetLastError();
    checks.Expect(err != cudaSuccess, "close_one_too_many_fails",
                  RtName(err) + " (the driver answers CUDA_ERROR_INVALID_VALUE)");
  }
  return checks.Finish();
}

// --- parent ----------------------------------------------------------------------------------

// Builds the child's environment: the parent's, with VMMIPC_RANK=1 when the exporter is ranked
// (so importer and exporter ranks differ, as between two ranks of a server).
std::vector<std::string> ChildEnvironment(bool ranked) {
  std::vector<std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (ranked && std::strncmp(*entry, "VMMIPC_RANK=", 12) == 0) continue;
    env.emplace_back(*entry);
  }
  if (ranked) env.emplace_back("VMMIPC_RANK=1");
  return env;
}

// Spawns `argv` with `env`, waits up to the timeout. Returns "" on exit 0, else what happened.
std::string SpawnAndWait(const std::vector<std::string>& args,
                         const std::vector<std::string>& env) {
  std::vector<char*> argv;
  for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const std::string& entry : env) envp.push_back(const_cast<char*>(entry.c_str()));
  envp.push_back(nullptr);

  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), envp.data());
  if (rc != 0) return std::string("posix_spawn failed: ") + std::strerror(rc);

  const auto deadline = Clock::now() + std::chrono::seconds(kChildTimeoutSeconds);
  int status = 0;
  while (true) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) return std::string("waitpid: ") + std::strerror(errno);
    if (Clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return "child timed out after " + std::to_string(kChildTimeoutSeconds) + " s (killed)";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (WIFEXITED(status)) {
    return WEXITSTATUS(status) == 0 ? ""
                                    : "child exited with " + std::to_string(WEXITSTATUS(status));
  }
  if (WIFSIGNALED(status)) return "child killed by signal " + std::to_string(WTERMSIG(status));
  return "child ended with status " + std::to_string(status);
}

std::string SelfExe() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return "/proc/self/exe";
  path[n] = '\0';
  return path;
}

int RunParent(bool expect_unhooked) {
  Checks checks(expect_unhooked ? "baseline" : "parent");
  constexpr int kDevice = 0;
  const bool loaded = VmmipcLoaded();
  const bool ranked = ExporterIsRanked();
  checks.Info("LD_PRELOAD='" + EnvOr("LD_PRELOAD", "") +
              "', VMMIPC_RANK=" + EnvOr("VMMIPC_RANK", "(unset)") +
              ", VMMIPC_LOG_LEVEL=" + EnvOr("VMMIPC_LOG_LEVEL", "(unset)"));
  const int init = InitDevice(checks, kDevice);
  if (init != kExitPass) return init;
  std::string why;
  if (!DeviceSupportsVmmFds(kDevice, &why)) {
    std::printf("SKIP: device %d cannot export VMM memory as POSIX fds: %s\n", kDevice,
                why.c_str());
    return kExitSkip;
  }
  if (expect_unhooked) {
    checks.Expect(!loaded, "vmmipc_not_loaded",
                  loaded ? "libvmmipc is mapped: the baseline must run WITHOUT LD_PRELOAD"
                         : "running on the bare driver, as intended");
  } else {
    checks.Expect(loaded, "vmmipc_loaded",
                  loaded ? "libvmmipc is mapped into the process"
                         : "libvmmipc is NOT mapped: set LD_PRELOAD=/path/to/libvmmipc.so "
                           "(every check below will show the unhooked driver)");
  }

  VmmBuffer buffer;
  const std::string create_error = buffer.Create(kDevice);
  if (!checks.Expect(create_error.empty(), "allocate_vmm",
                     create_error.empty()
                         ? "2 x " + Hex(buffer.granularity()) + " at " + Hex(buffer.base())
                         : create_error)) {
    return checks.Finish();
  }
  const size_t granularity = buffer.granularity();
  const size_t total = buffer.bytes();
  const size_t interior = granularity + kInteriorOffset;
  {
    const cudaError_t err = WritePattern(buffer.ptr(0), kSeedOriginal, 0, total);
    const std::string diff = err == cudaSuccess
                                 ? ReadAndCompare(buffer.ptr(0), kSeedOriginal, 0, total)
                                 : "cudaMemcpy(HtoD): " + RtName(err);
    if (!checks.Expect(diff.empty(), "fill_pattern",
                       diff.empty() ? "cudaMemcpy round trip" : diff)) {
      return checks.Finish();
    }
  }

  int capable = 0;
  const std::string attr_error = IpcCapable(buffer.base(), &capable);
  const int want_capable = expect_unhooked ? 0 : 1;
  checks.Expect(attr_error.empty() && capable == want_capable, "ipc_capable_attribute",
                attr_error.empty() ? "IS_LEGACY_CUDA_IPC_CAPABLE=" + std::to_string(capable) +
                                         " (want " + std::to_string(want_capable) + ")"
                                   : "cuPointerGetAttribute: " + attr_error);

  cudaIpcMemHandle_t handle_base{};
  cudaIpcMemHandle_t handle_interior{};
  auto get = [&](void* ptr, cudaIpcMemHandle_t* handle, cudaError_t* err_out) {
    const auto start = Clock::now();
    const cudaError_t err = cudaIpcGetMemHandle(handle, ptr);
    const double micros = MicrosSince(start);
    if (err != cudaSuccess) cudaGetLastError();
    *err_out = err;
    char timing[64];
    std::snprintf(timing, sizeof(timing), " in %.0f us", micros);
    return RtName(err) + timing;
  };

  if (expect_unhooked) {
    // The driver's own answer on VMM memory (docs/driver-behaviour.md): cudaErrorInvalidValue.
    cudaError_t err = cudaSuccess;
    const std::string got = get(buffer.ptr(0), &handle_base, &err);
    checks.Expect(err == cudaErrorInvalidValue, "get_handle_vmm_refused",
                  "cudaIpcGetMemHandle(VMM base) -> " + got +
                      (err == cudaErrorInvalidValue
                           ? ": the unhooked driver refuses VMM memory, as measured"
                           : ": expected cudaErrorInvalidValue (docs/driver-behaviour.md)"));
    // Control: legacy memory still exports, so IPC itself works on this machine.
    void* legacy = nullptr;
    err = cudaMalloc(&legacy, kLegacyBytes);
    if (err == cudaSuccess) {
      cudaIpcMemHandle_t handle{};
      cudaError_t get_err = cudaSuccess;
      const std::string legacy_got = get(legacy, &handle, &get_err);
      checks.Expect(get_err == cudaSuccess, "get_handle_cudamalloc_works", legacy_got);
      cudaFree(legacy);
    } else {
      checks.Expect(false, "get_handle_cudamalloc_works", "cudaMalloc: " + RtName(err));
    }
    std::string release_error;
    buffer.Release(&release_error);
    checks.Expect(release_error.empty(), "cleanup",
                  release_error.empty() ? "unmapped, released, freed" : release_error);
    return checks.Finish();
  }

  cudaError_t err_base = cudaSuccess;
  cudaError_t err_interior = cudaSuccess;
  std::string got = get(buffer.ptr(0), &handle_base, &err_base);
  checks.Expect(err_base == cudaSuccess, "get_handle_base",
                "cudaIpcGetMemHandle(" + Hex(buffer.base()) + ") -> " + got +
                    (err_base == cudaSuccess ? ", handle " + HandleToHex(handle_base)
                                             : GetFailureHint(err_base)));
  got = get(buffer.ptr(interior), &handle_interior, &err_interior);
  checks.Expect(err_interior == cudaSuccess, "get_handle_interior",
                "cudaIpcGetMemHandle(base + " + Hex(interior) + ") -> " + got +
                    (err_interior == cudaSuccess ? ", handle " + HandleToHex(handle_interior)
                                                 : GetFailureHint(err_interior)));

  // Pass-through control: a cudaMalloc buffer, which the real driver exports.
  void* legacy = nullptr;
  cudaIpcMemHandle_t handle_legacy{};
  cudaError_t err_legacy = cudaMalloc(&legacy, kLegacyBytes);
  if (err_legacy == cudaSuccess) {
    err_legacy = WritePattern(legacy, kSeedLegacyOriginal, 0, kLegacyBytes);
  }
  if (err_legacy == cudaSuccess) {
    got = get(legacy, &handle_legacy, &err_legacy);
  } else {
    got = RtName(err_legacy);
    cudaGetLastError();
  }
  checks.Expect(err_legacy == cudaSuccess, "get_handle_legacy", "cudaMalloc buffer -> " + got);

  // Opening in the exporting process fails (driver: CUDA_ERROR_INVALID_CONTEXT, which cudart
  // reports as cudaErrorDeviceUninitialized, 201).
  if (err_base == cudaSuccess) {
    void* self = nullptr;
    const cudaError_t err =
        cudaIpcOpenMemHandle(&self, handle_base, cudaIpcMemLazyEnablePeerAccess);
    cudaGetLastError();
    if (err == cudaSuccess) cudaIpcCloseMemHandle(self);
    checks.Expect(err != cudaSuccess, "open_in_exporter_fails",
                  "cudaIpcOpenMemHandle in the exporter -> " + RtName(err) +
                      (err == 201 ? " (= CUDA_ERROR_INVALID_CONTEXT, as the driver)"
                                  : " (the driver answers CUDA_ERROR_INVALID_CONTEXT = 201)"));
  }

  if (err_base != cudaSuccess || err_interior != cudaSuccess || err_legacy != cudaSuccess) {
    checks.Info("not starting the child: a handle is missing");
  } else {
    const std::vector<std::string> args = {SelfExe(),
                                           "child",
                                           std::to_string(kDevice),
                                           std::to_string(granularity),
                                           ranked ? "1" : "0",
                                           HandleToHex(handle_base),
                                           HandleToHex(handle_interior),
                                           HandleToHex(handle_legacy)};
    checks.Info("starting the child (" + std::string(ranked ? "ranked exporter" : "unranked") +
                ")");
    const auto start = Clock::now();
    const std::string child_error = SpawnAndWait(args, ChildEnvironment(ranked));
    char detail[64];
    std::snprintf(detail, sizeof(detail), "child exited 0 after %.1f ms", MicrosSince(start) / 1e3);
    checks.Expect(child_error.empty(), "child", child_error.empty() ? detail : child_error);

    // What the child wrote, and what it must have left alone.
    std::string diff = ReadAndCompare(buffer.ptr(0), kSeedReplyFirstChunk, 0, granularity);
    checks.Expect(diff.empty(), "reply_first_chunk",
                  diff.empty() ? "the child's write through the base pointer landed" : diff);
    diff = ReadAndCompare(buffer.ptr(granularity), kSeedOriginal, granularity, kInteriorOffset);
    checks.Expect(diff.empty(), "untouched_window",
                  diff.empty() ? "[granularity, interior) kept the original pattern" : diff);
    diff = ReadAndCompare(buffer.ptr(interior), kSeedReplySecondChunk, interior, total - interior);
    checks.Expect(diff.empty(), "reply_interior",
                  diff.empty() ? "the child's write through the interior pointer landed at "
                                 "base + " +
                                     Hex(interior)
                               : diff);
    diff = ReadAndCompare(legacy, kSeedLegacyReply, 0, kLegacyBytes);
    checks.Expect(diff.empty(), "reply_legacy",
                  diff.empty() ? "the child's write to the cudaMalloc buffer landed" : diff);
  }

  if (legacy != nullptr) cudaFree(legacy);
  std::string release_error;
  buffer.Release(&release_error);
  checks.Expect(release_error.empty(), "cleanup",
                release_error.empty() ? "unmapped, released, freed" : release_error);
  return checks.Finish();
}

void Usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s parent [--expect-unhooked]\n"
               "  parent                 run the IPC round trip (needs LD_PRELOAD=libvmmipc.so)\n"
               "  parent --expect-unhooked\n"
               "                         baseline without vmmipc: VMM export must fail\n"
               "  (the parent starts `%s child ...` itself)\n"
               "exit: 0 pass, 1 fail, 77 skip (no CUDA device)\n",
               argv0, argv0);
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string mode = argc >= 2 ? argv[1] : "";
  if (mode == "child") return RunChild(argc, argv);
  if (mode == "parent" && argc == 2) return RunParent(false);
  if (mode == "parent" && argc == 3 && std::strcmp(argv[2], "--expect-unhooked") == 0) {
    return RunParent(true);
  }
  Usage(argv[0]);
  return kExitUsage;
}
