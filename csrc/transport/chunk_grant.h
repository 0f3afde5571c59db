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

// Why an exporter refused a request; travels on the wire as a u16. Declared
// once here: the enum, its log name and its VMMIPC_STATS counter
// (core/stats.h) come from this list; the CUresult an importer returns for
// each is core's (core/ipc_import.cc, a switch that fails the build when a
// reason is missing).
// X(enumerator, wire value, "name in log lines", stats counter, "counter name")
#define VMMIPC_REFUSE_REASONS(X)                                                             \
  /* The request MAC did not verify: a stale handle (pid reuse), an edited or forged one. */ \
  X(kBadToken, 1, "bad token", kRefusedBadToken, "refused_bad_token")                        \
  /* SO_PEERCRED uid differs from the exporter's. */                                         \
  X(kWrongUser, 2, "wrong user", kRefusedWrongUser, "refused_wrong_user")                    \
  /* The address was never given to cuIpcGetMemHandle here. */                               \
  X(kNotExported, 3, "not exported", kRefusedNotExported, "refused_not_exported")            \
  /* The memory is no longer mapped, or was re-created (generation changed). */              \
  X(kFreed, 4, "freed", kRefusedFreed, "refused_freed")                                      \
  /* The driver refused to export a chunk. */                                                \
  X(kExportFailed, 5, "export failed", kRefusedExportFailed, "refused_export_failed")        \
  /* The span has more chunks than the protocol allows. */                                   \
  X(kTooManyChunks, 6, "too many chunks", kRefusedTooManyChunks, "refused_too_many_chunks")  \
  /* Anything else on the exporter's side. */                                                \
  X(kInternal, 7, "internal error", kRefusedInternal, "refused_internal")                    \
  /* A malformed or unknown-version request. */                                              \
  X(kBadRequest, 8, "bad request", kRefusedBadRequest, "refused_bad_request")

enum class RefuseReason : uint16_t {
  kNone = 0,
#define VMMIPC_REFUSE_ENUM(id, value, name, counter, counter_name) id = value,
  VMMIPC_REFUSE_REASONS(VMMIPC_REFUSE_ENUM)
#undef VMMIPC_REFUSE_ENUM
};
const char* RefuseReasonName(RefuseReason reason);

}  // namespace vmmipc::transport
