// Import ahead (VMMIPC_PREFETCH=2): the import side's thread that imports
// kept prefetched fds into the driver before any open asks, so that an open
// that takes them only maps. The open never waits for it: a chunk being
// imported is taken with its fd alone (the thread then releases what it
// imported), and an import that fails leaves the fd for the open to import.
#include <mutex>

#include "common/quiet_thread.h"
#include "core/import/import_side.h"

namespace vmmipc::core {

bool ImportSide::StartImportAhead(ImportFn import, ReleaseFn release) {
  std::lock_guard<std::mutex> lock(import_mutex_);
  if (!import_ahead_thread_) {
    try {
      import_ahead_thread_ = StartQuietThread(
          "vmmipc-prefetch", [this, import, release] { ImportAheadLoop(import, release); });
    } catch (...) {
      return false;
    }
    if (!import_ahead_thread_) return false;
  }
  import_ahead_wake_.notify_one();
  return true;
}

void ImportSide::ImportAheadLoop(ImportFn import, ReleaseFn release) {
  for (;;) {
    ledger::ExporterId exporter;
    uint64_t address = 0, serial = 0;
    ScopedFd fd;
    {
      std::unique_lock<std::mutex> lock(import_mutex_);
      import_ahead_wake_.wait(lock, [&] {
        if (import_ahead_stop_) return true;
        std::lock_guard<ForkMutex> kept(prefetch_mutex_);
        return prefetched_.NextToImport(&exporter, &address, &serial, &fd);
      });
      if (import_ahead_stop_) return;
    }
    uint64_t handle = 0;
    const bool imported = import(fd.get(), &handle);
    fd.Reset();
    if (!imported) continue;  // the open imports it, as without
    bool kept = false;
    {
      std::lock_guard<std::mutex> lock(import_mutex_);
      std::lock_guard<ForkMutex> kept_lock(prefetch_mutex_);
      kept = prefetched_.Imported(exporter, address, serial, handle);
    }
    if (!kept) release(handle);  // taken or dropped meanwhile
  }
}

ImportSide::~ImportSide() {
  std::unique_ptr<std::thread> thread;
  {
    std::lock_guard<std::mutex> lock(import_mutex_);
    import_ahead_stop_ = true;
    import_ahead_wake_.notify_all();
    thread = std::move(import_ahead_thread_);
  }
  if (thread && thread->joinable()) thread->join();
}

}  // namespace vmmipc::core
