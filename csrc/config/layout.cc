// The layout check: zone geometry first, then the import zone, the fallback
// zone (which must not overlap the zone) and the arena (which must fit a slot
// and overlap neither zone), each part checked against the ones already
// settled, so the zone wins over the fallback zone and both over the arena.
#include "config/layout.h"

#include <functional>
#include <initializer_list>
#include <utility>
#include <vector>

#include "common/log.h"

namespace vmmipc::config {
namespace {

// For ranges already known to end below kUserAddressEnd (no wrap-around).
bool Overlaps(uint64_t a, uint64_t a_size, uint64_t b, uint64_t b_size) {
  return a < b + b_size && b < a + a_size;
}

std::string Span(const char* what, uint64_t base, uint64_t size) {
  return fmt::format("the {} [0x{:x}, +{})", what, base, log::Bytes(size));
}

// Why [base, base + size) cannot be reserved: it wraps around or ends past
// the top of the user address space. Empty when it fits.
std::string PastTheTop(const char* what, uint64_t base, uint64_t size) {
  if (size <= kUserAddressEnd && base <= kUserAddressEnd - size) return "";
  return fmt::format("{} ends past 0x{:x}, the top of the 47-bit user address space",
                     Span(what, base, size), kUserAddressEnd);
}

// The warning line, and the outcome of each variable whose value it changed.
void Warn(Params* p, std::initializer_list<const char*> changed, std::string warning) {
  for (const char* name : changed) {
    const size_t index = ParamIndex(name);
    if (index >= kParamCount) continue;  // a part's unused second name ("")
    Outcome& outcome = p->outcomes[index];
    outcome.origin = Origin::kLayout;
    outcome.why = warning;
  }
  p->warnings.push_back(std::move(warning));
}

// One part of the layout: `problem` says why it does not fit (empty when it
// does). Such a part falls back to its defaults; when they do not fit either
// (or it already had them), it is turned off. One warning line either way.
struct LayoutPart {
  std::string values;             // "VMMIPC_X=0x..." as parsed, for the warning
  const char* first = "";         // the variables `values` names (second: "" when one)
  const char* second = "";        // ...
  const char* off_variable = "";  // the one turning the part off changes
  bool at_default = false;        // the values are the defaults already
  std::function<std::string()> problem;
  std::string default_text;
  std::function<void()> use_default;
  std::function<void()> turn_off;
  bool* turned_off = nullptr;  // Params::turned_off's flag for the part
  const char* off_text = "";
};

void Settle(const LayoutPart& part, Params* p) {
  const std::string why = part.problem();
  if (why.empty()) return;
  if (part.at_default) {
    part.turn_off();
    *part.turned_off = true;
    Warn(p, {part.off_variable},
         fmt::format("{} (the default): {}; {}", part.values, why, part.off_text));
    return;
  }
  part.use_default();
  const std::string why_default = part.problem();
  if (why_default.empty()) {
    Warn(p, {part.first, part.second},
         fmt::format("ignoring {}: {}; using the default {}", part.values, why, part.default_text));
    return;
  }
  part.turn_off();
  *part.turned_off = true;
  Warn(p, {part.first, part.second, part.off_variable},
       fmt::format("ignoring {}: {}; the default {} does not fit either ({}); {}", part.values, why,
                   part.default_text, why_default, part.off_text));
}

// Slots x slot size must not overflow nor exceed the user address space;
// returns the zone's size, after going back to the default geometry if not.
uint64_t SettleZoneGeometry(Params* p, const Params& d) {
  uint64_t zone_size = 0;
  const bool wraps =
      __builtin_mul_overflow(static_cast<uint64_t>(p->zone_slots), p->slot_size, &zone_size);
  if (!wraps && zone_size <= kUserAddressEnd) return zone_size;
  const std::string why =
      wraps ? std::string("overflows 64 bits")
            : fmt::format("is {}, more than the 47-bit user address space", log::Bytes(zone_size));
  const std::string warning = fmt::format(
      "ignoring VMMIPC_ZONE_SLOTS={} and VMMIPC_SLOT_SIZE=0x{:x}: the import zone (slots x slot "
      "size) {}; using the defaults {} x 0x{:x}",
      p->zone_slots, p->slot_size, why, d.zone_slots, d.slot_size);
  p->zone_slots = d.zone_slots;
  p->slot_size = d.slot_size;
  Warn(p, {"VMMIPC_ZONE_SLOTS", "VMMIPC_SLOT_SIZE"}, warning);
  return static_cast<uint64_t>(p->zone_slots) * p->slot_size;
}

void SettleZone(Params* p, const Params& d, uint64_t zone_size) {
  LayoutPart zone;
  zone.values = fmt::format("VMMIPC_ZONE_BASE=0x{:x}", p->zone_base);
  zone.first = zone.off_variable = "VMMIPC_ZONE_BASE";
  zone.at_default = p->zone_base == d.zone_base;
  zone.problem = [&]() -> std::string {
    return p->zone_base == 0 ? "" : PastTheTop("import zone", p->zone_base, zone_size);
  };
  zone.default_text = fmt::format("0x{:x}", d.zone_base);
  zone.use_default = [&] { p->zone_base = d.zone_base; };
  zone.turn_off = [&] { p->zone_base = 0; };
  zone.turned_off = &p->turned_off.zone;
  zone.off_text =
      "no import zone at VMMIPC_ZONE_BASE (the fallback zone is tried, else peers are placed "
      "best-effort)";
  Settle(zone, p);
}

void SettleFallbackZone(Params* p, const Params& d, uint64_t zone_size) {
  LayoutPart fallback;
  fallback.values = fmt::format("VMMIPC_ZONE_FALLBACK_BASE=0x{:x}", p->zone_fallback_base);
  fallback.first = fallback.off_variable = "VMMIPC_ZONE_FALLBACK_BASE";
  fallback.at_default = p->zone_fallback_base == d.zone_fallback_base;
  fallback.problem = [&]() -> std::string {
    const uint64_t base = p->zone_fallback_base;
    if (base == 0) return "";
    std::string why = PastTheTop("fallback zone", base, zone_size);
    if (why.empty() && p->zone_base != 0 && Overlaps(base, zone_size, p->zone_base, zone_size))
      why = Span("fallback zone", base, zone_size) + " overlaps " +
            Span("import zone", p->zone_base, zone_size);
    return why;
  };
  fallback.default_text = fmt::format("0x{:x}", d.zone_fallback_base);
  fallback.use_default = [&] { p->zone_fallback_base = d.zone_fallback_base; };
  fallback.turn_off = [&] { p->zone_fallback_base = 0; };
  fallback.turned_off = &p->turned_off.fallback;
  fallback.off_text = "no fallback zone";
  Settle(fallback, p);
}

// Why the arena [base, +size) does not fit the settled zones; empty when it does.
std::string ArenaProblem(const Params& p, uint64_t zone_size) {
  const uint64_t base = p.arena_base, size = p.arena_size;
  // The region base in handles is the arena base: every carve must mirror
  // into the exporter's one slot in every importer.
  if (size > p.slot_size)
    return fmt::format(
        "the export arena's size {} is larger than VMMIPC_SLOT_SIZE ({}), so it could not "
        "mirror into one importer slot",
        log::Bytes(size), log::Bytes(p.slot_size));
  std::string why = PastTheTop("export arena", base, size);
  if (!why.empty()) return why;
  for (auto [what, other] :
       {std::pair{"import zone", p.zone_base}, std::pair{"fallback zone", p.zone_fallback_base}}) {
    if (other != 0 && Overlaps(base, size, other, zone_size))
      return Span("export arena", base, size) + " overlaps " + Span(what, other, zone_size);
  }
  return "";
}

void SettleArena(Params* p, const Params& d, uint64_t zone_size) {
  if (!p->arena) return;  // off by choice: nothing to check
  LayoutPart arena;
  arena.values = fmt::format("VMMIPC_ARENA_BASE=0x{:x} and VMMIPC_ARENA_SIZE=0x{:x}", p->arena_base,
                             p->arena_size);
  arena.first = "VMMIPC_ARENA_BASE";
  arena.second = "VMMIPC_ARENA_SIZE";
  arena.off_variable = "VMMIPC_ARENA";
  arena.at_default = p->arena_base == d.arena_base && p->arena_size == d.arena_size;
  arena.problem = [&] { return ArenaProblem(*p, zone_size); };
  arena.default_text = fmt::format("0x{:x} and 0x{:x}", d.arena_base, d.arena_size);
  arena.use_default = [&] {
    p->arena_base = d.arena_base;
    p->arena_size = d.arena_size;
  };
  arena.turn_off = [&] { p->arena = false; };
  arena.turned_off = &p->turned_off.arena;
  arena.off_text = "export arena off (a ranked process's own addresses may differ between runs)";
  Settle(arena, p);
}

}  // namespace

void SettleLayout(Params* p) {
  const Params d;
  const uint64_t zone_size = SettleZoneGeometry(p, d);
  SettleZone(p, d, zone_size);
  SettleFallbackZone(p, d, zone_size);
  SettleArena(p, d, zone_size);
}

}  // namespace vmmipc::config
