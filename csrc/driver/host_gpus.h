// Which GPU of the host a device of this process is: its index among all the
// host's GPUs in PCI bus order. The driver numbers only the devices that
// CUDA_VISIBLE_DEVICES leaves visible (a worker that sees one GPU calls it
// device 0 whichever it is), so the index comes from the device's PCI
// address, asked of the driver, looked up in the host's own list of GPUs.
// It gives a process without a rank variable a slot that is the same in every
// run and differs between the GPUs of one host (core/export/rank_slot.h).
#pragma once

#include <cuda.h>

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "driver/real_driver.h"

namespace vmmipc::driver {

struct PciAddress {
  uint32_t domain = 0;
  uint32_t bus = 0;
  uint32_t device = 0;
  uint32_t function = 0;
  auto operator<=>(const PciAddress&) const = default;
};

// "0000:18:00.0" (sysfs, /proc) or "00000000:18:00.0" (the driver), hex in
// either case; nullopt for anything else (the other entries of a driver's
// sysfs folder: "bind", "module", ...).
std::optional<PciAddress> ParsePciAddress(std::string_view text);
std::string FormatPciAddress(const PciAddress& address);

// The GPUs of the host, sorted by PCI address, from one folder whose entries
// are named by PCI address. With `need_display_class`, an entry counts only
// when its "class" file says display controller (sysfs lists every function
// the nvidia driver binds, NVSwitches included). Empty, with `why`, when the
// folder cannot be read or names no GPU.
std::vector<PciAddress> ListHostGpus(const std::string& folder, bool need_display_class,
                                     std::string* why);

struct HostGpu {
  int index = -1;       // in PCI order among the host's GPUs; -1 when unknown
  int count = 0;        // GPUs in the host's list
  std::string pci;      // the device's PCI address, when the driver told it
  std::string list;     // the folder the list was read from
  std::string why_not;  // when index is -1: why
};

// Where the GPU at `address` stands among the host's GPUs, from the list in
// `folder` (VMMIPC_HOST_GPUS); empty: /proc/driver/nvidia/gpus, else
// /sys/bus/pci/drivers/nvidia. Asks no driver (vmmipc-config is given the
// address).
HostGpu LocateHostGpu(const PciAddress& address, const std::string& folder);

// LocateHostGpu for `device` (an ordinal of this process), asking `real` for
// its PCI address.
HostGpu FindHostGpu(const RealDriver& real, CUdevice device, const std::string& folder);

}  // namespace vmmipc::driver
