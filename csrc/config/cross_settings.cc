// Warnings about combinations of settings, each valid alone, that do less
// than their variables say. Kept here, in the configuration, rather than where
// the feature runs, so that the library's log and vmmipc-run --check (through
// vmmipc-config) print the same lines from one place.
#include "config/cross_settings.h"

namespace vmmipc::config {

void AddCrossSettingWarnings(Params* params) {
  if (params->ahead && !params->follow)
    params->warnings.push_back(
        "VMMIPC_AHEAD=1 does nothing with VMMIPC_FOLLOW=0 (announcements come over the follow "
        "connection, and its events drop what was mapped ahead when the exporter unmaps it)");
}

}  // namespace vmmipc::config
