// vmmipc-config: prints, as JSON on stdout, what libvmmipc.so would settle in
// this environment: every VMMIPC_* variable (value, default, where it came
// from, why it was refused), the address layout, the rank, the slot of each
// GPU asked about (--pci), and whether the sockets can be used. The launcher
// (vmmipc-run, python -m vmmipc) asks it instead of keeping a copy of the
// rules; it is built from the library's config, driver (host GPU list),
// transport (socket naming) and common layers, and runs no CUDA.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/params.h"
#include "tool/json.h"
#include "tool/report.h"
#include "tool/socket_verdict.h"

extern char** environ;

namespace vmmipc::tool {
namespace {

constexpr const char* kUsage =
    "usage: vmmipc-config [--pci ADDRESS]...\n"
    "Prints, as JSON, the configuration libvmmipc.so would settle in this environment:\n"
    "every VMMIPC_* variable (value, default, source, error), the address layout, the\n"
    "rank, and whether the sockets can be used.\n"
    "  --pci ADDRESS  also the rank slot of the GPU at this PCI address (0000:18:00.0),\n"
    "                 from its index among the host's GPUs; may be repeated\n"
    "  --version      print the version\n"
    "Exit status: 0 the report was printed, 2 a usage error, 1 it could not be written.\n";

int Usage(const std::string& problem) {
  std::fprintf(stderr, "vmmipc-config: %s\n%s", problem.c_str(), kUsage);
  return 2;
}

// The VMMIPC_* names of the environment that no variable of params.def has.
std::vector<std::string> UnknownVariables() {
  std::vector<std::string> unknown;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    const std::string_view name = text.substr(0, text.find('='));
    if (name.substr(0, 7) != "VMMIPC_" || config::ParamIndex(name) != config::kParamCount) continue;
    bool renamed = false;  // an old name: the library takes it, with its own warning
    for (const config::RenamedParam& old : config::RenamedParams())
      renamed = renamed || name == old.old_name;
    if (!renamed) unknown.emplace_back(name);
  }
  std::sort(unknown.begin(), unknown.end());
  return unknown;
}

int Run(int argc, char** argv) {
  ReportInput input;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg(argv[i]);
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg == "--version") {
      std::printf("vmmipc-config %s\n", VMMIPC_VERSION_STRING);
      return 0;
    }
    if (arg == "--pci") {
      if (i + 1 == argc) return Usage("--pci needs a PCI address");
      input.pci.emplace_back(argv[++i]);
    } else if (arg.substr(0, 6) == "--pci=") {
      input.pci.emplace_back(arg.substr(6));
    } else {
      return Usage(fmt::format("unknown argument '{}'", arg));
    }
  }
  // Parse, as the library does, but without Get(): nothing is logged and no
  // log file is opened; the warnings go into the report.
  input.params = config::Parse([](const char* name) { return std::getenv(name); });
  for (const config::ParamSpec& spec : config::AllParams()) {
    const char* text = std::getenv(spec.name);
    input.set.push_back(text != nullptr ? std::optional<std::string>(text) : std::nullopt);
  }
  input.unknown = UnknownVariables();
  input.sockets = JudgeSockets(input.params.socket_dir, static_cast<uint32_t>(geteuid()));
  Json json;
  WriteReport(input, &json);
  const std::string& text = json.text();
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0) {
    std::fprintf(stderr, "vmmipc-config: cannot write the report: %s\n", std::strerror(errno));
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace vmmipc::tool

int main(int argc, char** argv) { return vmmipc::tool::Run(argc, argv); }
