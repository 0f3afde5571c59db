// ProcessState: everything vmmipc knows about this process, created on first
// use (never at load time) and never destroyed (hooks can run during exit):
// its identity (pid, secret, instance, rank, slots from the GPU) and its
// three sides, export, import and the export arena (core/*_side.h).
// A forked child gets a fresh one: new secret, no listener, no imports, since
// the parent's threads, sockets and GPU mappings do not carry over.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

#include "common/random.h"
#include "core/arena/arena_side.h"
#include "core/export/export_side.h"
#include "core/import/import_side.h"
#include "transport/siphash.h"

namespace vmmipc::core {

struct ProcessState {
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
  // device ordinal (core/export/rank_slot.h): 0 not asked yet, -1 none, else slot+1.
  // Each is written once, under gpu_slot_mutex, then only read.
  static constexpr int kMaxSlotDevices = 64;
  std::atomic<int32_t> gpu_slots[kMaxSlotDevices] = {};
  std::mutex gpu_slot_mutex;
  bool gpu_slot_tagged = false;  // the log tag names a slot from the GPU; under gpu_slot_mutex

  // Each side owns its data and its lock, with the rule at the top of its header.
  ExportSide exporter;
  ImportSide importer;
  ArenaSide arena;
};

// The process's state; creates it (and registers the fork handler) on first call.
ProcessState& State();

}  // namespace vmmipc::core
