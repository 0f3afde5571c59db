// The application's cuIpcOpenMemHandle as entry's hooks call it: the open
// (core/import/ipc_import.cc), legacy or VMM2, with the background export
// (core/export/background_export.h) paused for its length: an export beside
// an import makes the import slower (measured on an H200: 2-3x), and the
// background export has all the time it wants.
#include "core/export/export_ahead.h"
#include "core/hooks.h"

namespace vmmipc::core {

CUresult ApplicationOpen(CUdeviceptr* pointer, const CUipcMemHandle& handle, unsigned int flags,
                         bool v2) {
  BusyScope busy(BackgroundIfOn());
  return IpcOpenMemHandle(pointer, handle, flags, v2);
}

}  // namespace vmmipc::core
