// Settings that are valid each alone but do less than they say together
// (cross_settings.cc): one list, for Parse.
#pragma once

#include "config/params.h"

namespace vmmipc::config {

// Appends to `params->warnings` one line per such combination. Parse calls it
// last, so the library logs these lines with the others when it reads its
// configuration (config::Get), and vmmipc-config reports them, which is what
// `vmmipc-run --check` shows: both read this one list.
void AddCrossSettingWarnings(Params* params);

}  // namespace vmmipc::config
