// The sections of vmmipc-config's JSON report, each from the library's own
// pieces: config::Parse and its outcomes, Params::SlotFor, the host's GPU
// list (driver/host_gpus.h), the socket verdict.
#include "tool/report.h"

#include <optional>

#include "driver/host_gpus.h"

namespace vmmipc::tool {
namespace {

const char* KindName(config::Kind kind) {
  switch (kind) {
    case config::Kind::kBool:
      return "bool";
    case config::Kind::kInt:
      return "int";
    case config::Kind::kSize:
      return "size";
    case config::Kind::kString:
      return "string";
    case config::Kind::kLogLevel:
      return "level";
  }
  return "?";
}

// The outcome's source as the report names it; for the rank rule, the rank's.
std::string SourceName(const config::Params& p, config::Origin origin) {
  switch (origin) {
    case config::Origin::kDefault:
      return "default";
    case config::Origin::kEnvironment:
      return "environment";
    case config::Origin::kIgnored:
      return "ignored";
    case config::Origin::kLayout:
      return "layout";
    case config::Origin::kRankRule:
      return p.rank_source != "none" ? p.rank_source : "VMMIPC_RANK_FROM";
  }
  return "?";
}

// A value's text as JSON of its kind, read back with the parsers the library uses.
void Value(config::Kind kind, const std::string& text, Json* json) {
  bool flag = false;
  int64_t number = 0;
  uint64_t size = 0;
  if (kind == config::Kind::kBool && config::ParseBool(text.c_str(), &flag))
    json->Bool(flag);
  else if (kind == config::Kind::kInt && config::ParseInt(text.c_str(), &number))
    json->Int(number);
  else if (kind == config::Kind::kSize && config::ParseSize(text.c_str(), &size))
    json->Uint(size);
  else
    json->String(text);
}

void WriteVariables(const ReportInput& in, Json* json) {
  json->Key("variables");
  json->BeginArray();
  const auto specs = config::AllParams();
  for (size_t i = 0; i < specs.size(); ++i) {
    const config::Outcome& outcome = in.params.outcomes[i];
    const std::string text = config::ValueText(in.params, i);
    json->BeginObject();
    json->Field("name", specs[i].name);
    json->Field("kind", KindName(specs[i].kind));
    json->Key("value");
    Value(specs[i].kind, text, json);
    json->Field("text", text);
    json->Field("default", specs[i].default_text);
    json->FieldOrNull("set", in.set[i]);
    json->Field("source", SourceName(in.params, outcome.origin));
    json->FieldOrNull("error", outcome.why.empty() ? std::nullopt : std::optional(outcome.why));
    json->FieldOrNull("reason",
                      outcome.reason.empty() ? std::nullopt : std::optional(outcome.reason));
    json->EndObject();
  }
  json->EndArray();
}

void WriteStrings(const char* key, const std::vector<std::string>& items, Json* json) {
  json->Key(key);
  json->BeginArray();
  for (const std::string& item : items) json->String(item);
  json->EndArray();
}

void WriteLayout(const config::Params& p, Json* json) {
  const uint64_t zone_size = static_cast<uint64_t>(p.zone_slots) * p.slot_size;
  json->Key("layout");
  json->BeginObject();
  json->Field("address_end", config::kUserAddressEnd);
  json->Key("zone");
  json->BeginObject();
  json->Field("on", p.zone_base != 0);
  json->Field("no_room", p.turned_off.zone);
  json->Field("base", p.zone_base);
  json->Field("slots", p.zone_slots);
  json->Field("slot_size", p.slot_size);
  json->Field("size", zone_size);
  json->EndObject();
  json->Key("fallback");
  json->BeginObject();
  json->Field("on", p.zone_fallback_base != 0);
  json->Field("no_room", p.turned_off.fallback);
  json->Field("base", p.zone_fallback_base);
  json->Field("size", zone_size);
  json->EndObject();
  json->Key("arena");
  json->BeginObject();
  json->Field("on", p.arena);
  json->Field("no_room", p.turned_off.arena);
  json->Field("wanted", p.arena_wanted());
  json->Field("base", p.arena_base);
  json->Field("size", p.arena_size);
  json->EndObject();
  json->EndObject();
}

void WriteRank(const config::Params& p, Json* json) {
  json->Key("rank");
  json->BeginObject();
  json->Field("rank", p.rank);
  json->Field("source", p.rank_source);
  json->Field("rank_from", p.rank_from);
  json->Field("slot_from_gpu", p.slot_from_gpu());
  json->Field("arena_wanted", p.arena_wanted());
  json->Field("zone_slots", p.zone_slots);
  json->Field("fits_zone", p.rank >= 0 && p.rank < p.zone_slots);
  json->EndObject();
}

// One GPU asked about: where it stands among the host's GPUs, and its slot.
void WriteGpu(const config::Params& p, const std::string& pci, Json* json) {
  const std::optional<driver::PciAddress> address = driver::ParsePciAddress(pci);
  driver::HostGpu gpu;
  if (address)
    gpu = driver::LocateHostGpu(*address, p.host_gpus);
  else
    gpu.why_not = fmt::format("'{}' is not a PCI address", pci);
  const int64_t slot = p.SlotFor(gpu.index);
  json->BeginObject();
  json->Field("pci", pci);
  json->FieldOrNull("address", gpu.pci.empty() ? std::nullopt : std::optional(gpu.pci));
  json->Field("index", gpu.index);
  json->Field("count", gpu.count);
  json->FieldOrNull("list", gpu.list.empty() ? std::nullopt : std::optional(gpu.list));
  json->FieldOrNull("why_not", gpu.why_not.empty() ? std::nullopt : std::optional(gpu.why_not));
  json->FieldOrNull("slot", slot >= 0 ? std::optional(slot) : std::nullopt);
  json->Field("fits_zone", slot >= 0 && slot < p.zone_slots);
  json->EndObject();
}

// Where the log lines would go: the file of VMMIPC_LOG_FILE as this process
// names it (%p: this process's pid), and the warning the library would print
// instead of using it.
void WriteLogFile(const ReportInput& in, Json* json) {
  const std::string& pattern = in.params.log_file;
  json->Key("log_file");
  json->BeginObject();
  json->Field("pattern", pattern);
  json->FieldOrNull("path",
                    pattern.empty() ? std::nullopt : std::optional(log::FileNameHere(pattern)));
  json->Field("usable", in.log_file_problem.empty());
  json->FieldOrNull(
      "problem", in.log_file_problem.empty() ? std::nullopt : std::optional(in.log_file_problem));
  json->EndObject();
}

void WriteSockets(const SocketVerdict& v, Json* json) {
  json->Key("sockets");
  json->BeginObject();
  json->Field("kind", v.abstract ? "abstract" : "directory");
  json->Field("dir", v.dir);
  json->Field("pattern", v.pattern);
  json->Field("network_namespace", v.network_namespace);
  json->Field("uid", static_cast<int64_t>(v.uid));
  json->Field("name_uid", static_cast<int64_t>(v.name_uid));
  json->Field("usable", v.usable);
  json->FieldOrNull("problem", v.problem.empty() ? std::nullopt : std::optional(v.problem));
  json->FieldOrNull("why", v.why.empty() ? std::nullopt : std::optional(v.why));
  json->Field("longest_path", static_cast<uint64_t>(v.longest_path));
  json->Field("path_limit", static_cast<uint64_t>(v.path_limit));
  json->EndObject();
}

}  // namespace

void WriteReport(const ReportInput& in, Json* json) {
  json->BeginObject();
  json->Field("tool", "vmmipc-config");
  json->Field("version", VMMIPC_VERSION_STRING);
  WriteVariables(in, json);
  WriteStrings("unknown_variables", in.params.unknown, json);
  WriteStrings("warnings", in.params.warnings, json);
  json->Field("summary", config::Describe(in.params));
  WriteLayout(in.params, json);
  WriteRank(in.params, json);
  json->Key("gpus");
  json->BeginArray();
  for (const std::string& pci : in.pci) WriteGpu(in.params, pci, json);
  json->EndArray();
  WriteLogFile(in, json);
  WriteSockets(in.sockets, json);
  json->EndObject();
}

}  // namespace vmmipc::tool
