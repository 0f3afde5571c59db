// Rank slots: from the rank variable, else from the GPU, cached per device.
#include "core/export/rank_slot.h"

#include <mutex>

#include "common/log.h"
#include "config/params.h"
#include "core/real.h"
#include "driver/host_gpus.h"
#include "ledger/handle_codec.h"

namespace vmmipc::core {
namespace {

// Params::SlotFor's bound is the highest slot a handle can say.
static_assert(config::kMaxRank + 1 == ledger::kUnranked);

constexpr int32_t kNotAsked = 0;
constexpr int32_t kNoSlot = -1;

// Finds the slot of `device` from the host's GPU list and logs what came of
// it, once per device: the answer is the same for the life of the process.
// The first slot found names the process in every log line from then on,
// this one included. Caller holds self.gpu_slot_mutex.
int32_t FindGpuSlot(Identity& self, int32_t device, const config::Params& params) {
  const driver::HostGpu gpu = driver::FindHostGpu(Real(), device, params.host_gpus);
  // An explicit VMMIPC_RANK_FROM=gpu that cannot be honoured is a warning;
  // under auto it is the ordinary state of a process without a rank.
  const log::Level level = params.rank_from == "gpu" ? log::Level::kWarn : log::Level::kInfo;
  if (gpu.index < 0) {
    log::Log(level,
             "no rank slot from the GPU for device {}: {}; peers place this process's memory "
             "best-effort (set VMMIPC_RANK or LOCAL_RANK)",
             device, gpu.why_not);
    return kNoSlot;
  }
  if (params.SlotFor(gpu.index) < 0) return kNoSlot;  // a handle cannot say it
  if (!self.gpu_slot_tagged) {
    self.gpu_slot_tagged = true;
    log::SetRank(gpu.index, /*from_gpu=*/true);
  }
  VMMIPC_LOG_INFO(
      "rank slot {} from the GPU (VMMIPC_RANK_FROM={}): device {} is {}, GPU {} of {} on this "
      "host in PCI order ({})",
      gpu.index, params.rank_from, device, gpu.pci, gpu.index, gpu.count, gpu.list);
  if (gpu.index >= params.zone_slots)
    VMMIPC_LOG_WARN(
        "rank slot {} (from the GPU) is not below VMMIPC_ZONE_SLOTS={}: importers with that "
        "zone place this process's memory best-effort",
        gpu.index, params.zone_slots);
  return gpu.index;
}

}  // namespace

uint16_t SlotForExport(Identity& self, int32_t device) {
  if (self.rank >= 0) return static_cast<uint16_t>(self.rank);
  const config::Params& params = config::Get();
  if (!params.slot_from_gpu() || device < 0 || device >= Identity::kMaxSlotDevices)
    return ledger::kUnranked;
  std::atomic<int32_t>& cached = self.gpu_slots[device];
  int32_t slot = cached.load(std::memory_order_acquire);
  if (slot == kNotAsked) {
    std::lock_guard<std::mutex> lock(self.gpu_slot_mutex);
    slot = cached.load(std::memory_order_relaxed);
    if (slot == kNotAsked) {
      const int32_t found = FindGpuSlot(self, device, params);
      slot = found == kNoSlot ? kNoSlot : found + 1;
      cached.store(slot, std::memory_order_release);
    }
  }
  return slot == kNoSlot ? ledger::kUnranked : static_cast<uint16_t>(slot - 1);
}

}  // namespace vmmipc::core
