// The benchmarks of vmmipc_bench (run in the importer, the benchmark process)
// and what they need from main: options, the importer's device and context.
#pragma once

#include <cuda.h>

#include <string>
#include <vector>

namespace vmmipc_bench {

struct Options {
  double iters_scale = 1.0;      // multiplies every benchmark's iteration count
  int device = 0;                // CUDA device ordinal, exporter and importer alike
  int load_samples = 9;          // process starts per load benchmark run (pairs with a preload)
  double load_budget_s = 4.0;    // ... but no more time than this per run (at least 3 samples)
  double timeout_s = 60.0;       // bound on every wait for the exporter
  bool phase_markers = false;    // "vmmipc_bench: begin <name>" on stderr before each benchmark
  std::string self_exe;          // this binary, for the exporter and the load children
  std::string preload;           // LD_PRELOAD value that holds vmmipc ("" when none is known)
  bool hooks_active = false;     // vmmipc's hooks are in this process (cuIpcGetMemHandle hooked)
  std::vector<std::string> env;  // this process's environment
  std::vector<std::string> exporter_env;  // the exporter's (env + VMMIPC_RANK)
  CUdevice cu_device = 0;
};

// Registers every benchmark that can run in this process.
void RegisterBenchmarks(const Options& options);
// Frees the importer's own buffers and stops the exporter.
void ReleaseBenchmarkResources();
// True when any benchmark reported an error (the exit status says so).
bool AnyBenchmarkFailed();

// Child mode for the load benchmarks: "exit" (start and exit) or "cuinit"
// (cuInit(0), then exit). Writes "threads_at_main=N threads_after=M" to stdout.
int LoadChildMain(const std::string& mode);

}  // namespace vmmipc_bench
