// The fields a VMM2 handle names, as transport carries them: the one place a
// decoded handle (ledger/handle_codec.h) becomes the fields that its
// capability covers and every request for it repeats (transport/wire.h).
#pragma once

#include "ledger/handle_codec.h"
#include "transport/wire.h"

namespace vmmipc::core {

inline transport::wire::HandleFields FieldsOf(const ledger::Vmm2Handle& h) {
  return {h.pid, h.generation, h.rank_slot, h.address, h.chunk_base, h.chunk_size, h.region_base};
}

}  // namespace vmmipc::core
