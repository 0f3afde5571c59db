// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the standard short
// table-driven form. Used to checksum VMM2 handles.
#pragma once

#include <cstddef>
#include <cstdint>

namespace vmmipc {

uint32_t Crc32c(const void* data, size_t size);

}  // namespace vmmipc
