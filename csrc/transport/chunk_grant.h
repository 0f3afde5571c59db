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
  uint32_t generation = 0;  // the exporter's identity for the physical chunk
  ScopedFd fd;              // the shareable handle (CLOEXEC)
};

// Why an exporter refused a request; travels on the wire as a u16. Declared
// once here: the enum and its log name come from this list. What each means
// to the library is core's: the CUresult an importer returns
// (core/import/open_fetch.cc) and the VMMIPC_STATS counter (core/stats.h), both
// switches that fail the build when a reason is missing.
// X(enumerator, wire value, "name in log lines")
#define VMMIPC_REFUSE_REASONS(X)                                                             \
  /* The request MAC did not verify: a stale handle (pid reuse), an edited or forged one. */ \
  X(kBadToken, 1, "bad token")                                                               \
  /* SO_PEERCRED uid differs from the exporter's. */                                         \
  X(kWrongUser, 2, "wrong user")                                                             \
  /* The address was never given to cuIpcGetMemHandle here. */                               \
  X(kNotExported, 3, "not exported")                                                         \
  /* The memory is no longer mapped, or was re-created (generation changed). */              \
  X(kFreed, 4, "freed")                                                                      \
  /* The driver refused to export a chunk. */                                                \
  X(kExportFailed, 5, "export failed")                                                       \
  /* The span has more chunks than the protocol allows. */                                   \
  X(kTooManyChunks, 6, "too many chunks")                                                    \
  /* Anything else on the exporter's side. */                                                \
  X(kInternal, 7, "internal error")                                                          \
  /* A malformed or unknown-version request. */                                              \
  X(kBadRequest, 8, "bad request")

enum class RefuseReason : uint16_t {
  kNone = 0,
#define VMMIPC_REFUSE_ENUM(id, value, name) id = value,
  VMMIPC_REFUSE_REASONS(VMMIPC_REFUSE_ENUM)
#undef VMMIPC_REFUSE_ENUM
};
const char* RefuseReasonName(RefuseReason reason);

}  // namespace vmmipc::transport
