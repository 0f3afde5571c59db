/* vmmipc: public constants for programs that want to recognise vmmipc's
 * handles without linking anything. libvmmipc.so exports no API of its own:
 * it works by interposing on the CUDA driver (LD_PRELOAD). The layout of the
 * 64-byte handle is in docs/blob-format.md. C and C++. */
#ifndef VMMIPC_VMMIPC_H_
#define VMMIPC_VMMIPC_H_

#include <stdint.h>
#include <string.h>

#define VMMIPC_VERSION_MAJOR 0
#define VMMIPC_VERSION_MINOR 1
#define VMMIPC_VERSION_PATCH 0

/* Bytes 0..3 of every VMM2 handle ("VMM2"), and byte 4: its version. */
#define VMMIPC_HANDLE_MAGIC "VMM2"
#define VMMIPC_HANDLE_VERSION_OFFSET 4
/* Bytes 6..7, little-endian: the exporter's rank slot; this value when unranked. */
#define VMMIPC_HANDLE_UNRANKED 0xFFFFu

/* Nonzero when the 64 bytes of a CUipcMemHandle start like a vmmipc handle.
 * A cheap test of the magic only: vmmipc itself also checks the CRC-32C and
 * the version before it trusts one. */
static inline int vmmipc_looks_like_vmm2_handle(const void* handle_bytes) {
  return memcmp(handle_bytes, VMMIPC_HANDLE_MAGIC, 4) == 0;
}

/* The exporter's rank slot recorded in a VMM2 handle. */
static inline unsigned vmmipc_handle_rank_slot(const void* handle_bytes) {
  const unsigned char* b = (const unsigned char*)handle_bytes;
  return (unsigned)b[6] | ((unsigned)b[7] << 8);
}

#endif /* VMMIPC_VMMIPC_H_ */
