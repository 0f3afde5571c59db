// The open's place step: the run's zone slot, or best-effort placement with
// one line that says why not.
#include <string>

#include "core/import/opening.h"
#include "core/import/vmm_calls.h"
#include "core/stats.h"
#include "driver/status.h"
#include "ledger/import_zone.h"

namespace vmmipc::core {
namespace {

// Best-effort placement lines: an application that opens and closes in a
// loop makes one per open (common/log_limit.h).
log::LineLimit g_placement_lines;

// Why the run cannot take its zone slot, nullptr when it can: no rank slot,
// no zone, a slot it does not fit. `*target` is the slot's address for it.
const char* WhyNoSlot(ImportSide& importer, const Opening& open, uint64_t* target) {
  const ledger::Vmm2Handle& h = open.handle;
  if (h.rank_slot == ledger::kUnranked)
    return "the exporter has no rank slot (no rank variable, and none from its GPU)";
  const std::optional<ledger::ZoneLayout> zone = ImportZone(importer);
  if (!zone) return "there is no import zone";
  const std::optional<uint64_t> in_slot =
      ledger::ZoneTarget(*zone, h.rank_slot, h.region_base, open.run_base(), open.run_size());
  if (!in_slot)
    return "the run does not fit the exporter's slot (rank >= VMMIPC_ZONE_SLOTS, or offset "
           "beyond VMMIPC_SLOT_SIZE)";
  *target = *in_slot;
  return nullptr;
}

// " (instance <hex>)" when `one` and `other` share a pid (processes of two
// pid namespaces), so that the collision line tells them apart; else "".
std::string SamePidNote(const ledger::ExporterId& one, const ledger::ExporterId& other) {
  return one.pid == other.pid ? fmt::format(" (instance {:08x})", one.instance) : "";
}

// The line of a best-effort placement: once per (slot, exporter) a warning for a
// ranked exporter, an info line for an unranked one, debug lines after that.
void SayBestEffort(const Opening& open, const char* why_not, bool repeat) {
  const ledger::Vmm2Handle& h = open.handle;
  const uint64_t size = open.run_size();
  if (repeat)
    VMMIPC_LOG_DEBUG("placing {} from pid {} best-effort: {}", log::Bytes(size), h.pid, why_not);
  else if (h.rank_slot == ledger::kUnranked)
    log::LogLimited(g_placement_lines, log::Level::kInfo, "placement", "best-effort placements",
                    "placing {} from pid {} best-effort: {}", log::Bytes(size), h.pid, why_not);
  else
    log::LogLimited(g_placement_lines, log::Level::kWarn, "placement", "best-effort placements",
                    "placing {} from pid {} (rank {}) best-effort, not at a "
                    "deterministic address: {}",
                    log::Bytes(size), h.pid, h.rank_slot, why_not);
}

CUresult OtherRun(const Opening& open) {
  stats::Count(stats::Counter::kOpenFailedMap);
  OpenWarning(log::Level::kWarn,
              "cuIpcOpenMemHandle(pid {}, 0x{:x}): an open of another run of the exporter "
              "already returned that pointer; close it first",
              open.handle.pid, open.handle.address);
  return CUDA_ERROR_MAP_FAILED;
}

}  // namespace

CUresult PlaceRun(ImportSide& importer, Opening* open) {
  const auto place_start = SteadyClock::now();
  const ledger::Vmm2Handle& h = open->handle;
  const ledger::ExporterId exporter{h.pid, h.instance};
  const int32_t device = static_cast<int32_t>(open->device);
  uint64_t target = 0;
  const char* why_not = WhyNoSlot(importer, *open, &target);
  bool repeat = false;
  bool other_run = false;
  std::string collision;
  if (why_not == nullptr) {
    open->placement.run_target = target;
    const ImportSide::ClaimResult claimed = importer.ClaimRun(
        h.rank_slot, exporter, target, open->pointer(), open->run, device, &open->plan);
    switch (claimed.claim) {
      case ImportSide::Claim::kPlanned:
        open->placement.zone_slot = h.rank_slot;
        open->place_us = MicrosSince(place_start);
        return CUDA_SUCCESS;
      case ImportSide::Claim::kOtherRun:
        other_run = true;
        break;
      case ImportSide::Claim::kCollision:
        stats::Count(stats::Counter::kSlotCollisions);
        repeat = claimed.repeat;
        // Two containers' exporters can have one pid: then their instances
        // tell them apart.
        collision = fmt::format(
            "rank slot {} already serves pid {}{}, and pid {}{} claims it too (two processes on "
            "one GPU without a rank variable, or the same rank twice); set VMMIPC_RANK (or "
            "LOCAL_RANK) to a different value in each process",
            h.rank_slot, claimed.owner.pid, SamePidNote(claimed.owner, exporter), h.pid,
            SamePidNote(exporter, claimed.owner));
        why_not = collision.c_str();
        break;
      case ImportSide::Claim::kOccupied:
        why_not =
            "its slot range already holds other memory (a stale chunk the exporter re-created, "
            "or another reservation of the exporter at the same offset)";
        break;
    }
  }
  // A run mapped ahead goes only where the application's open would go for
  // sure: its deterministic address. Else the application's open places it
  // (and says why, once).
  if (open->ahead()) return CUDA_ERROR_ALREADY_MAPPED;
  if (other_run) return OtherRun(*open);
  SayBestEffort(*open, why_not, repeat);
  stats::Count(stats::Counter::kPlacementsBestEffort);
  Placement& placement = open->placement;
  placement = {};
  VMMIPC_RETURN_IF_ERROR(ReserveAnywhere(open->run_size(), &placement.private_reservation));
  placement.private_size = open->run_size();
  placement.run_target = placement.private_reservation;
  // A reservation of its own holds nothing yet: every chunk is planned.
  if (importer
          .ClaimRun(ledger::kNotInZone, exporter, placement.run_target, open->pointer(), open->run,
                    device, &open->plan)
          .claim != ImportSide::Claim::kPlanned) {
    FreeReservation(placement.private_reservation, placement.private_size);
    return OtherRun(*open);
  }
  open->place_us = MicrosSince(place_start);
  return CUDA_SUCCESS;
}

}  // namespace vmmipc::core
