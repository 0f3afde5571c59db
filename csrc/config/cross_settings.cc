// Warnings about combinations of settings, each valid alone, that do less
// than their variables say. Kept here, in the configuration, rather than where
// the feature runs, so that the library's log and vmmipc-run --check (through
// vmmipc-config) print the same lines from one place.
#include "config/cross_settings.h"

#include <fmt/format.h>

namespace vmmipc::config {

void AddCrossSettingWarnings(Params* params) {
  if (params->prefetch != 0 && !params->follow)
    params->warnings.push_back(fmt::format(
        "VMMIPC_PREFETCH={} does nothing without VMMIPC_FOLLOW=1 (its events drop what was "
        "prefetched when the exporter unmaps it); set both, in every process",
        params->prefetch));
}

}  // namespace vmmipc::config
