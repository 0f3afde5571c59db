// Starting the export listener (transport/serve/listener/listener.h) on the first
// export: its options and the export side's callbacks.
#pragma once

#include <memory>

#include "core/export/export_side.h"
#include "core/identity.h"
#include "transport/serve/listener/listener.h"

namespace vmmipc::core {

// Starts the listener, on the first export (under the export side's lock,
// ExportSide::EnsureListener); `context` is the one its threads will use.
// Null when it cannot start (one error line says why).
std::unique_ptr<transport::Listener> StartListener(const Identity& self, ExportSide& exporter,
                                                   void** context);

}  // namespace vmmipc::core
