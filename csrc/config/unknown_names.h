// The unknown VMMIPC_* names of an environment (unknown_names.cc), for Parse.
#pragma once

#include <string>
#include <vector>

#include "config/params.h"

namespace vmmipc::config {

// The names of `names` that look like ours but are not, each listed in
// `params->unknown` and warned about in `params->warnings`, with the name it
// most likely means (SuggestName).
void ParseUnknownNames(const EnvLookup& lookup, const std::vector<std::string>& names,
                       Params* params);

}  // namespace vmmipc::config
