// The variables' table of docs/configuration.md, from the one declaration of
// each variable (config/params.def) and the rules and spellings its parse uses.
#include "tool/markdown.h"

#include <fmt/format.h>

#include "config/params.h"

namespace vmmipc::tool {

std::string VariablesTable() {
  std::string out = "| variable | default | accepts | meaning |\n| --- | --- | --- | --- |\n";
  for (const config::ParamSpec& spec : config::AllParams())
    out += fmt::format("| `{}` | `{}` | {} | {} |\n", spec.name, spec.default_text,
                       config::DescribeValues(spec.kind, spec.rule), spec.doc);
  return out;
}

}  // namespace vmmipc::tool
