// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78). Used to checksum
// VMM2 handles.
#pragma once

#include <cstddef>
#include <cstdint>

namespace vmmipc {

uint32_t Crc32c(const void* data, size_t size);
// The table-driven form Crc32c falls back to without SSE4.2; for tests.
uint32_t Crc32cPortable(const void* data, size_t size);

}  // namespace vmmipc
