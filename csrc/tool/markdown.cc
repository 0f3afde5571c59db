// The variables' table of docs/configuration.md, from the one declaration of
// each variable (config/params.def) and the rules and spellings its parse uses.
#include "tool/markdown.h"

#include <fmt/format.h>

#include "config/params.h"

namespace vmmipc::tool {

std::string VariablesTable() {
  // The user's table, then the one for tests and benchmarks (params.def).
  std::string out;
  for (const bool for_tests : {false, true}) {
    if (for_tests)
      out +=
          "\nFor tests and benchmarks: these take another path through the same code, to measure "
          "it or to reach it; no workload needs their non-default values.\n\n";
    out += "| variable | default | accepts | meaning |\n| --- | --- | --- | --- |\n";
    for (const config::ParamSpec& spec : config::AllParams())
      if (spec.for_tests == for_tests)
        out += fmt::format("| `{}` | `{}` | {} | {} |\n", spec.name, spec.default_text,
                           config::DescribeValues(spec.kind, spec.rule), spec.doc);
  }
  return out;
}

}  // namespace vmmipc::tool
