// vmmipc-config's report: the settled configuration of an environment as one
// JSON document (docs/configuration.md describes its fields).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "config/params.h"
#include "tool/json.h"
#include "tool/socket_verdict.h"

namespace vmmipc::tool {

struct ReportInput {
  config::Params params;                        // config::Parse of the environment
  std::vector<std::optional<std::string>> set;  // per variable of AllParams(): its text, if set
  std::string log_file_problem;                 // log::FileProblem of VMMIPC_LOG_FILE
  std::vector<std::string> pci;                 // the PCI addresses asked about (--pci), as given
  SocketVerdict sockets;
};

// The whole document: version, variables, unknown names, warnings, summary,
// layout, rank, GPUs, sockets.
void WriteReport(const ReportInput& input, Json* json);

}  // namespace vmmipc::tool
