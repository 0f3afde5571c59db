// The host's GPU list: PCI addresses as the driver, /proc and sysfs spell
// them, folders with other entries, PCI order, and the display-class filter
// that keeps NVSwitches out of sysfs's list.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "driver/host_gpus.h"

namespace vmmipc::driver {
namespace {

namespace fs = std::filesystem;

TEST(HostGpus, PciAddressesParseInEverySpelling) {
  auto a = ParsePciAddress("0000:18:00.0");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->bus, 0x18u);
  auto b = ParsePciAddress("00000000:9A:1f.7");  // the driver's: 8-digit domain, upper case
  ASSERT_TRUE(b);
  EXPECT_EQ(b->domain, 0u);
  EXPECT_EQ(b->bus, 0x9Au);
  EXPECT_EQ(b->device, 0x1Fu);
  EXPECT_EQ(b->function, 7u);
  EXPECT_EQ(FormatPciAddress(*b), "0000:9a:1f.7");
  EXPECT_EQ(*ParsePciAddress("0001:18:00.0") <=> *ParsePciAddress("0000:ff:00.0"),
            std::strong_ordering::greater);
  for (const char* bad :
       {"", "bind", "0000:18:00", "0000:18:00.8", "0000:18:20.0", "000:18:00.0", "0000:018:00.0",
        "0000:1g:00.0", "0000:18:00.0x", "0000-18-00.0", "000000000:18:00.0"})
    EXPECT_FALSE(ParsePciAddress(bad)) << bad;
}

class HostGpuFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("vmmipc-host-gpus-" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Entry(const std::string& name, const char* pci_class = nullptr) {
    fs::create_directories(dir_ / name);
    if (pci_class != nullptr) std::ofstream(dir_ / name / "class") << pci_class << "\n";
  }
  fs::path dir_;
};

TEST_F(HostGpuFolder, ListIsInPciOrderAndSkipsOtherEntries) {
  for (const char* name : {"0000:9a:00.0", "0000:1b:00.0", "0001:05:00.0", "0000:1B:00.0"})
    Entry(name);
  for (const char* name : {"bind", "unbind", "module", "new_id"}) Entry(name);
  std::string why;
  auto gpus = ListHostGpus(dir_.string(), false, &why);
  ASSERT_EQ(gpus.size(), 3u) << why;  // 1b and 1B are one address
  EXPECT_EQ(FormatPciAddress(gpus[0]), "0000:1b:00.0");
  EXPECT_EQ(FormatPciAddress(gpus[1]), "0000:9a:00.0");
  EXPECT_EQ(FormatPciAddress(gpus[2]), "0001:05:00.0");
}

TEST_F(HostGpuFolder, SysfsListKeepsDisplayControllersOnly) {
  Entry("0000:18:00.0", "0x030200");  // 3D controller: an H100/H200
  Entry("0000:19:00.0", "0x030000");  // VGA
  Entry("0000:05:00.0", "0x068000");  // bridge: an NVSwitch bound to the same driver
  Entry("0000:06:00.0");              // no class file
  std::string why;
  auto gpus = ListHostGpus(dir_.string(), true, &why);
  ASSERT_EQ(gpus.size(), 2u) << why;
  EXPECT_EQ(gpus[0].bus, 0x18u);
  EXPECT_EQ(gpus[1].bus, 0x19u);
  EXPECT_EQ(ListHostGpus(dir_.string(), false, &why).size(), 4u);
}

TEST_F(HostGpuFolder, UnreadableOrEmptyFoldersSayWhy) {
  std::string why;
  EXPECT_TRUE(ListHostGpus((dir_ / "missing").string(), false, &why).empty());
  EXPECT_NE(why.find("cannot be read"), std::string::npos) << why;
  Entry("bind");
  why.clear();
  EXPECT_TRUE(ListHostGpus(dir_.string(), false, &why).empty());
  EXPECT_NE(why.find("names no GPU"), std::string::npos) << why;
}

}  // namespace
}  // namespace vmmipc::driver
