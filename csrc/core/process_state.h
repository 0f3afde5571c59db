// ProcessState: everything vmmipc knows about this process, created on first
// use (never at load time) and never destroyed (hooks can run during exit):
// its identity (core/identity.h) and its two sides, export (with the export
// arena) and import. Each side reaches itself through its own accessor
// (Exporter(), Importer(), Arena(), OwnIdentity(), defined here with the
// state), so no side includes this header: only the hooks that span sides
// (allocation_hooks.cc, pointer_queries.cc), follow and the fork handlers do.
// A forked child gets a fresh one: new secret, no listener, no imports, since
// the parent's threads, sockets and GPU mappings do not carry over.
#pragma once

#include "core/export/export_side.h"
#include "core/identity.h"
#include "core/import/import_side.h"

namespace vmmipc::core {

struct ProcessState {
  Identity identity;
  // Each side owns its data and its lock, with the rule at the top of its header.
  ExportSide exporter;
  ImportSide importer;
};

// The process's state; creates it (and registers the fork handler) on first call.
ProcessState& State();

}  // namespace vmmipc::core
