// Simulated CUDA driver: introspection and fault injection for tests.
//
// Exported C functions of the simulator's libcuda.so.1 (tests/sim_driver). They do not exist in the
// real driver: a test that may also run against a real GPU looks them up with dlsym and skips the
// check when they are absent.
#ifndef VMMIPC_TESTS_SIM_DRIVER_SIM_INTROSPECT_H_
#define VMMIPC_TESTS_SIM_DRIVER_SIM_INTROSPECT_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// What the simulated driver holds in this process right now.
struct SimCudaStats {
  uint64_t live_allocations;    // cuMemCreate and imported handles alive (referenced or mapped)
  uint64_t mappings;            // cuMemMap ranges not yet unmapped
  uint64_t reservations;        // cuMemAddressReserve ranges not yet freed
  uint64_t legacy_allocations;  // cuMemAlloc allocations not yet freed
  uint64_t legacy_imports;      // distinct cuIpcOpenMemHandle mappings not yet closed
  uint64_t open_fds;            // file descriptors the simulator itself holds
};

// Fills *stats. Returns 0, or -1 if stats is null. Works before cuInit.
int simcuda_get_stats(struct SimCudaStats* stats);

// Makes the nth next call (1 = the very next) of the driver function `name` return `code` without
// doing anything. `name` is the base name ("cuMemMap", "cuIpcOpenMemHandle": both spellings of a
// versioned function count). nth == 0 removes the pending fault for `name`. Returns 0, or -1 on a
// bad argument. The same can be set for a whole process with the environment variable
// SIMCUDA_FAIL="name:nth:code[,name:nth:code...]", read by cuInit.
int simcuda_inject_failure(const char* name, unsigned int nth, int code);

// Makes the nth next call of `name` wait `ms` milliseconds before it does its work, without
// holding the simulator's lock (other threads' calls go on meanwhile): a window in which a test
// can change what the delayed call works on. cuMemMap, cuMemUnmap, cuMemExportToShareableHandle
// and cuMemImportFromShareableHandle honour it. Returns 0, or -1 on a bad argument (another call's
// name among them: it would never wait).
int simcuda_inject_delay(const char* name, unsigned int nth, unsigned int ms);

// The same, but the nth next call waits once its work is done, before it returns (its results,
// an exported fd, already exist): a window in which a test can act while the caller holds them.
// cuMemExportToShareableHandle alone honours it. Returns 0, or -1 on a bad argument (another
// call's name among them).
int simcuda_inject_delay_after(const char* name, unsigned int nth, unsigned int ms);

// Removes every pending injected fault and delay.
void simcuda_clear_failures(void);

// cuMemMap(ptr, size, offset, handle, 0) under a name that no preloaded hook answers: memory
// mapped this way is memory vmmipc did not see mapped (as memory mapped before it was loaded).
// Returns the CUresult.
int simcuda_mem_map(uint64_t ptr, uint64_t size, uint64_t offset, uint64_t handle);

#ifdef __cplusplus
}
#endif

#endif  // VMMIPC_TESTS_SIM_DRIVER_SIM_INTROSPECT_H_
