// vmmipc_bench: Google Benchmark suite for vmmipc against legacy CUDA IPC and
// the raw VMM driver floor (issue 5). This process is the importer; it starts
// an exporter helper (this binary with --vmmipc_exporter) on the same GPU.
// docs/benchmarks.md says what is measured and how to run it; usually through
// tests/bench/run_bench.sh, which runs it with and without the preload.
//
// Own flags (the rest are Google Benchmark's):
//   --iters_scale=X      multiply every iteration count (default 1; the sim smoke run uses 0.02)
//   --device=N           CUDA device ordinal (default 0)
//   --exporter_rank=N    VMMIPC_RANK of the exporter (default 0; -1 leaves the environment)
//   --load_samples=N     process starts per load benchmark run (default 9)
//   --load_budget_s=X    time cap of one load benchmark run (default 4)
//   --timeout_s=X        bound on every wait for the exporter or a child (default 60)
//   --vmmipc_lib=PATH    libvmmipc.so for the load benchmark's preload side when the
//                        program itself runs without it
//   --phase_markers      print "vmmipc_bench: begin <benchmark>" on stderr (to attribute
//                        VMMIPC_LOG_LEVEL=debug lines to benchmarks)
#include <benchmark/benchmark.h>
#include <cuda.h>
#include <signal.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "bench_common.h"
#include "benchmarks.h"
#include "exporter.h"

extern char** environ;

namespace vmmipc_bench {
namespace {

void OnSignal(int sig) {
  KillChildrenFromSignal();
  signal(sig, SIG_DFL);
  raise(sig);
}

void StopAtExit() {
  ExporterClient::Instance().Stop();
  ExporterClient::Floor().Stop();
}

bool TakeFlag(const std::string& arg, const char* name, std::string* value) {
  const std::string prefix = std::string(name) + "=";
  if (arg.rfind(prefix, 0) != 0) return false;
  *value = arg.substr(prefix.size());
  return true;
}

void PrintOwnFlags() {
  std::printf(
      "vmmipc_bench: vmmipc vs legacy CUDA IPC vs the raw VMM driver floor (docs/benchmarks.md)\n"
      "  --iters_scale=X  --device=N  --exporter_rank=N  --load_samples=N  --load_budget_s=X\n"
      "  --timeout_s=X  --vmmipc_lib=PATH  --phase_markers\n"
      "Google Benchmark flags follow.\n\n");
}

// "580.159.04" from /proc/driver/nvidia/version, or "" (no NVIDIA kernel driver: the simulator).
std::string NvidiaDriverVersion() {
  std::FILE* f = std::fopen("/proc/driver/nvidia/version", "r");
  if (f == nullptr) return "";
  char line[512] = {};
  const bool read = std::fgets(line, sizeof(line), f) != nullptr;
  std::fclose(f);
  if (!read) return "";
  // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Thu ...": the token with dots.
  std::string text = line, token, found;
  for (char c : text + " ") {
    if (c == ' ' || c == '\t' || c == '\n') {
      if (found.empty() && token.find('.') != std::string::npos && std::isdigit(token[0]))
        found = token;
      token.clear();
    } else {
      token += c;
    }
  }
  return found;
}

std::string Getenv(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

}  // namespace
}  // namespace vmmipc_bench

int main(int argc, char** argv) {
  using namespace vmmipc_bench;
  if (argc >= 2 && std::strcmp(argv[1], "--vmmipc_exporter") == 0) return ExporterMain(argc, argv);
  if (argc >= 2 && std::strncmp(argv[1], "--vmmipc_child=", 15) == 0)
    return LoadChildMain(argv[1] + 15);

  Options opt;
  int exporter_rank = 0;
  std::string vmmipc_lib;
  std::vector<char*> rest = {argv[0]};
  std::string command = argv[0];
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    command += " " + arg;
    std::string v;
    if (TakeFlag(arg, "--iters_scale", &v)) {
      opt.iters_scale = std::atof(v.c_str());
    } else if (TakeFlag(arg, "--device", &v)) {
      opt.device = std::atoi(v.c_str());
    } else if (TakeFlag(arg, "--exporter_rank", &v)) {
      exporter_rank = std::atoi(v.c_str());
    } else if (TakeFlag(arg, "--load_samples", &v)) {
      opt.load_samples = std::atoi(v.c_str());
    } else if (TakeFlag(arg, "--load_budget_s", &v)) {
      opt.load_budget_s = std::atof(v.c_str());
    } else if (TakeFlag(arg, "--timeout_s", &v)) {
      opt.timeout_s = std::atof(v.c_str());
    } else if (TakeFlag(arg, "--vmmipc_lib", &v)) {
      vmmipc_lib = v;
    } else if (arg == "--phase_markers") {
      opt.phase_markers = true;
    } else {
      if (arg == "--help" || arg == "-h") PrintOwnFlags();
      rest.push_back(argv[i]);
    }
  }
  if (opt.iters_scale <= 0 || opt.timeout_s <= 0) {
    std::fprintf(stderr, "vmmipc_bench: --iters_scale and --timeout_s must be positive\n");
    return 2;
  }
  int rest_argc = static_cast<int>(rest.size());
  rest.push_back(nullptr);
  benchmark::Initialize(&rest_argc, rest.data());
  if (benchmark::ReportUnrecognizedArguments(rest_argc, rest.data())) return 2;

  // Who is who: the real driver, the hooks, the preload.
  std::string error;
  RealDriver real;
  if (!LoadRealDriver(&real, &error)) {
    std::fprintf(stderr, "vmmipc_bench: %s\n", error.c_str());
    return 1;
  }
  const std::vector<std::string> hooked = HookedDriverNames(&error);
  std::string hooked_text;
  for (const auto& name : hooked) {
    hooked_text += (hooked_text.empty() ? "" : ",") + name;
    if (name == "cuIpcGetMemHandle") opt.hooks_active = true;
  }
  const std::string ld_preload = Getenv("LD_PRELOAD");
  if (ld_preload.find("vmmipc") != std::string::npos) {
    opt.preload = ld_preload;
  } else if (!vmmipc_lib.empty()) {
    opt.preload = ld_preload.empty() ? vmmipc_lib : ld_preload + ":" + vmmipc_lib;
  }
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) {
    std::perror("vmmipc_bench: readlink /proc/self/exe");
    return 1;
  }
  self[n] = '\0';
  opt.self_exe = self;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    opt.env.push_back(entry);
    if (exporter_rank >= 0 && entry.rfind("VMMIPC_RANK=", 0) == 0) continue;
    opt.exporter_env.push_back(entry);
  }
  if (exporter_rank >= 0)
    opt.exporter_env.push_back("VMMIPC_RANK=" + std::to_string(exporter_rank));

  // The importer's context.
  CUdevice device = 0;
  CUcontext context = nullptr;
  CUresult r = cuInit(0);
  if (r == CUDA_SUCCESS) r = cuDeviceGet(&device, opt.device);
  if (r == CUDA_SUCCESS) r = cuDevicePrimaryCtxRetain(&context, device);
  if (r == CUDA_SUCCESS) r = cuCtxSetCurrent(context);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "vmmipc_bench: %s\n",
                 CuFailure(r, "cuInit / cuDeviceGet / primary context").c_str());
    return 1;
  }
  opt.cu_device = device;
  char name[200] = {};
  if (cuDeviceGetName(name, sizeof(name), device) != CUDA_SUCCESS) std::strcpy(name, "?");
  int driver_version = 0;
  cuDriverGetVersion(&driver_version);

  ExporterClient::Instance().Configure(opt.self_exe, opt.device, opt.exporter_env, opt.timeout_s);
  ExporterClient::Floor().Configure(opt.self_exe, opt.device, opt.exporter_env, opt.timeout_s);
  std::atexit(StopAtExit);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) signal(sig, OnSignal);

  std::string layouts;
  for (const Layout& l : Layouts())
    layouts += (layouts.empty() ? "" : "; ") + l.name + ": " + l.Describe();
  const bool simulated = std::strstr(name, "vmmipc simulated device") != nullptr;
  benchmark::AddCustomContext("cuda_device", name);
  benchmark::AddCustomContext("cuda_driver_version", std::to_string(driver_version));
  const std::string nvidia = NvidiaDriverVersion();
  benchmark::AddCustomContext("nvidia_driver",
                              !nvidia.empty() ? nvidia
                              : simulated     ? "none (simulated driver)"
                                              : "unknown (/proc/driver/nvidia/version unreadable)");
  benchmark::AddCustomContext("simulated_driver", simulated ? "yes" : "no");
  benchmark::AddCustomContext("vmmipc_hooks_active", opt.hooks_active ? "yes" : "no");
  benchmark::AddCustomContext("vmmipc_hooked_functions",
                              hooked_text.empty() ? "none" : hooked_text);
  benchmark::AddCustomContext("ld_preload", ld_preload.empty() ? "none" : ld_preload);
  benchmark::AddCustomContext("load_preload", opt.preload.empty() ? "none" : opt.preload);
  benchmark::AddCustomContext(
      "exporter_rank", exporter_rank >= 0 ? std::to_string(exporter_rank) : "from the environment");
  benchmark::AddCustomContext("importer_rank_env", "VMMIPC_RANK=" + Getenv("VMMIPC_RANK") +
                                                       " LOCAL_RANK=" + Getenv("LOCAL_RANK") +
                                                       " RANK=" + Getenv("RANK"));
  benchmark::AddCustomContext("layouts", layouts);
  benchmark::AddCustomContext("iters_scale", std::to_string(opt.iters_scale));
  benchmark::AddCustomContext("bench_command", command);
  if (!opt.hooks_active) {
    std::fprintf(stderr,
                 "vmmipc_bench: vmmipc's hooks are not in this process (no preload): only the "
                 "legacy, floor, passthrough, bandwidth-local, piece and load benchmarks run\n");
  }

  RegisterBenchmarks(opt);
  benchmark::RunSpecifiedBenchmarks();
  ReleaseBenchmarkResources();
  benchmark::Shutdown();
  if (AnyBenchmarkFailed()) {
    std::fprintf(stderr, "vmmipc_bench: at least one benchmark failed (see above)\n");
    return 1;
  }
  return 0;
}
