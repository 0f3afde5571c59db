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
#include "tool/markdown.h"
#include "tool/report.h"
#include "tool/socket_verdict.h"

namespace vmmipc::tool {
namespace {

constexpr const char* kUsage =
    "usage: vmmipc-config [--pci ADDRESS]...\n"
    "       vmmipc-config --markdown\n"
    "Prints, as JSON, the configuration libvmmipc.so would settle in this environment:\n"
    "every VMMIPC_* variable (value, default, source, error), the address layout, the\n"
    "rank, and whether the sockets can be used.\n"
    "  --pci ADDRESS  also the rank slot of the GPU at this PCI address (0000:18:00.0),\n"
    "                 from its index among the host's GPUs; may be repeated\n"
    "  --markdown     print instead the table of every variable (default, what it\n"
    "                 accepts, meaning) that docs/configuration.md shows\n"
    "  --version      print the version\n"
    "Exit status: 0 the report was printed, 2 a usage error, 1 it could not be written.\n";

int Usage(const std::string& problem) {
  std::fprintf(stderr, "vmmipc-config: %s\n%s", problem.c_str(), kUsage);
  return 2;
}

int Run(int argc, char** argv) {
  ReportInput input;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg(argv[i]);
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg == "--markdown") {
      const std::string table = VariablesTable();
      return std::fwrite(table.data(), 1, table.size(), stdout) == table.size() &&
                     std::fflush(stdout) == 0
                 ? 0
                 : 1;
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
  // log file is opened (it is judged without creating it); the warnings go
  // into the report.
  input.params =
      config::Parse([](const char* name) { return std::getenv(name); }, config::EnvironmentNames());
  for (const config::ParamSpec& spec : config::AllParams()) {
    const char* text = std::getenv(spec.name);
    input.set.push_back(text != nullptr ? std::optional<std::string>(text) : std::nullopt);
  }
  input.log_file_problem = log::FileProblem(input.params.log_file);
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
