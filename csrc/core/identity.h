// Identity: who this process is to its peers: its pid, the secret its
// handles are made under, its public instance id, its rank from a variable,
// and the rank slots found from its GPUs. Part of the process state
// (core/process_state.h), made with it on first use and afresh in a forked
// child; the sides include this header, never the process state's.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

#include "common/random.h"
#include "transport/siphash.h"

namespace vmmipc::core {

struct Identity {
  uint32_t pid = 0;
  // Handles are capabilities made under `secret`, which never leaves the
  // process (transport/wire.h Capability); `instance` is public, in every
  // handle, and tells this process from an earlier one with the same pid.
  // Without randomness from the kernel there is no secret (has_secret false,
  // `no_secret` says why) and exports are refused; the instance is then only
  // unique (common/random.h FillUnique), which an importer needs.
  transport::SipKey secret;
  bool has_secret = false;
  RandomFailure no_secret;
  uint32_t instance = 0;  // never 0
  int32_t rank = -1;      // this process's slot from a rank variable, -1 none

  // Slots found from the GPU for a process without a rank variable, per
  // device ordinal (core/export/rank_slot.h): 0 not asked yet, -1 none, else
  // slot+1. Each is written once, under gpu_slot_mutex, then only read.
  static constexpr int kMaxSlotDevices = 64;
  std::atomic<int32_t> gpu_slots[kMaxSlotDevices] = {};
  std::mutex gpu_slot_mutex;
  bool gpu_slot_tagged = false;  // the log tag names a slot from the GPU; under gpu_slot_mutex
};

// This process's identity; makes the process state (core/process_state.cc)
// on the first call, as State() does.
Identity& OwnIdentity();

}  // namespace vmmipc::core
