// The host's GPUs by PCI address, from the NVIDIA driver's /proc folder or
// sysfs, and the index among them of a PCI address, or of one of this
// process's devices (whose address the driver tells).
#include "driver/host_gpus.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

#include "common/log.h"
#include "common/scoped_fd.h"
#include "driver/real_driver.h"

namespace vmmipc::driver {
namespace {

constexpr const char* kProcList = "/proc/driver/nvidia/gpus";
constexpr const char* kSysfsList = "/sys/bus/pci/drivers/nvidia";

// One hex field of exactly `digits` characters (0: one or more), then `end`.
bool HexField(std::string_view* text, size_t min_digits, size_t max_digits, char end,
              uint32_t* out) {
  const size_t stop = end == '\0' ? text->size() : text->find(end);
  if (stop == std::string_view::npos || stop < min_digits || stop > max_digits) return false;
  const char* first = text->data();
  auto [ptr, ec] = std::from_chars(first, first + stop, *out, 16);
  if (ec != std::errc() || ptr != first + stop) return false;
  text->remove_prefix(end == '\0' ? stop : stop + 1);
  return true;
}

// The first bytes of sysfs's "class" file: "0x030000" (VGA) or "0x030200"
// (3D controller) for a GPU.
bool IsDisplayClass(const std::string& folder, const std::string& entry) {
  const std::string path = folder + "/" + entry + "/class";
  ScopedFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return false;
  char text[8] = {};
  const ssize_t got = read(fd.get(), text, sizeof(text));
  return got >= 4 && text[0] == '0' && text[1] == 'x' && text[2] == '0' && text[3] == '3';
}

}  // namespace

std::optional<PciAddress> ParsePciAddress(std::string_view text) {
  PciAddress address;
  if (!HexField(&text, 4, 8, ':', &address.domain) || !HexField(&text, 2, 2, ':', &address.bus) ||
      !HexField(&text, 2, 2, '.', &address.device) ||
      !HexField(&text, 1, 1, '\0', &address.function) || address.device > 0x1f ||
      address.function > 7)
    return std::nullopt;
  return address;
}

std::string FormatPciAddress(const PciAddress& address) {
  return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", address.domain, address.bus, address.device,
                     address.function);
}

std::vector<PciAddress> ListHostGpus(const std::string& folder, bool need_display_class,
                                     std::string* why) {
  std::vector<PciAddress> gpus;
  DIR* dir = opendir(folder.c_str());
  if (dir == nullptr) {
    *why = fmt::format("{} cannot be read ({})", folder, std::strerror(errno));
    return gpus;
  }
  while (const dirent* entry = readdir(dir)) {
    std::optional<PciAddress> address = ParsePciAddress(entry->d_name);
    if (!address) continue;
    if (need_display_class && !IsDisplayClass(folder, entry->d_name)) continue;
    gpus.push_back(*address);
  }
  closedir(dir);
  std::sort(gpus.begin(), gpus.end());
  gpus.erase(std::unique(gpus.begin(), gpus.end()), gpus.end());
  if (gpus.empty()) *why = fmt::format("{} names no GPU", folder);
  return gpus;
}

HostGpu LocateHostGpu(const PciAddress& address, const std::string& folder) {
  HostGpu found;
  found.pci = FormatPciAddress(address);
  // The configured folder alone; else /proc (GPUs only), then sysfs.
  std::vector<std::pair<std::string, bool>> lists;
  if (!folder.empty()) {
    lists.emplace_back(folder, false);
  } else {
    lists.emplace_back(kProcList, false);
    lists.emplace_back(kSysfsList, true);
  }
  std::string whys;
  for (const auto& [list, need_class] : lists) {
    std::string why;
    std::vector<PciAddress> gpus = ListHostGpus(list, need_class, &why);
    if (gpus.empty()) {
      whys += (whys.empty() ? "" : "; ") + why;
      continue;
    }
    found.list = list;
    found.count = static_cast<int>(gpus.size());
    const auto at = std::find(gpus.begin(), gpus.end(), address);
    if (at == gpus.end()) {
      found.why_not =
          fmt::format("{} is not among the {} GPUs that {} lists", found.pci, gpus.size(), list);
      return found;
    }
    found.index = static_cast<int>(at - gpus.begin());
    return found;
  }
  found.why_not = fmt::format("no list of the host's GPUs: {}", whys);
  return found;
}

HostGpu FindHostGpu(const RealDriver& real, CUdevice device, const std::string& folder) {
  char bus_id[64] = {};
  const CUresult asked = real.DeviceGetPCIBusId != nullptr
                             ? real.DeviceGetPCIBusId(bus_id, sizeof(bus_id), device)
                             : MissingEntryPoint("DeviceGetPCIBusId");
  std::optional<PciAddress> mine;
  if (asked == CUDA_SUCCESS) mine = ParsePciAddress(bus_id);
  if (!mine) {
    HostGpu found;
    found.why_not =
        asked == CUDA_SUCCESS
            ? fmt::format("the driver gave device {} the PCI address '{}'", device, bus_id)
            : fmt::format("cuDeviceGetPCIBusId(device {}) failed: {}", device, ErrorName(asked));
    return found;
  }
  return LocateHostGpu(*mine, folder);
}

}  // namespace vmmipc::driver
