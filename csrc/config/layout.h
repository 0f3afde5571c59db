// The one check of the address layout that the values of params.def form
// together: the import zone, the fallback zone and the export arena (Parse,
// params.h, says the rules). Internal to config: Parse calls it once each
// value is valid on its own.
#pragma once

#include "config/params.h"

namespace vmmipc::config {

// Settles `p`'s layout in place: a part that does not fit goes back to its
// defaults, or off when they do not fit either, with one warning line in
// p->warnings; the outcomes of the variables it changed say so too.
void SettleLayout(Params* p);

}  // namespace vmmipc::config
