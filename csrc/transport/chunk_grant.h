// The unit the transport moves: one physical chunk of an exporter's memory,
// described by where it lies in the exporter and carried by a file descriptor.
// transport knows bytes and fds, never CUDA: the fd is opaque here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/scoped_fd.h"

namespace vmmipc::transport {

struct ChunkGrant {
  uint64_t address = 0;     // the chunk's base address in the exporter
  uint64_t size = 0;        // bytes
  uint64_t generation = 0;  // the exporter's identity for the physical chunk
  ScopedFd fd;              // the shareable handle (CLOEXEC)
};

// Why an exporter refused a request; travels on the wire as a u16.
enum class RefuseReason : uint16_t {
  kNone = 0,
  kBadToken = 1,       // MAC did not verify: stale handle (pid reuse) or forged request
  kWrongUser = 2,      // SO_PEERCRED uid differs from the exporter's
  kNotExported = 3,    // the address was never given to cuIpcGetMemHandle here
  kFreed = 4,          // the memory is no longer mapped, or was re-created (generation changed)
  kExportFailed = 5,   // the driver refused to export a chunk
  kTooManyChunks = 6,  // the span has more chunks than the protocol allows
  kInternal = 7,       // anything else on the exporter's side
  kBadRequest = 8,     // malformed or unknown-version request
};
const char* RefuseReasonName(RefuseReason reason);

}  // namespace vmmipc::transport
