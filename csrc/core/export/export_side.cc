// The export side's queue of chunks to export ahead, its export keep-alive, and
// its fork reset.
#include "core/export/export_side.h"

#include "common/log.h"
#include "common/parked.h"

namespace vmmipc::core {

bool ExportSide::QueueExportAhead(uint64_t address) noexcept {
  std::lock_guard<std::mutex> lock(ahead_mutex_);
  if (ahead_.size() >= kMaxExportAhead) return false;
  try {
    ahead_.push_back(address);
  } catch (...) {
    return false;
  }
  const bool post = !ahead_queued_;
  ahead_queued_ = true;
  return post;
}

bool ExportSide::TakeExportAhead(std::vector<uint64_t>* batch) {
  std::lock_guard<std::mutex> lock(ahead_mutex_);
  batch->clear();
  batch->swap(ahead_);
  if (!batch->empty()) return true;
  ahead_queued_ = false;
  return false;
}

void ExportSide::DropExportAhead() noexcept {
  std::lock_guard<std::mutex> lock(ahead_mutex_);
  ahead_.clear();
  ahead_queued_ = false;
}

void ExportSide::HoldExportKeepAlive(uint64_t handle, ScopedFd fd) {
  std::lock_guard<ForkMutex> lock(keepalive_mutex_);
  keepalive_handle_ = handle;
  keepalive_fd_ = std::move(fd);
}

// The listener is looked at only once ready: listener_ never changes then. One
// that became ready after PrepareFork had its lock left alone, which its
// ParentAfterFork knows.
void ExportSide::PrepareFork() noexcept {
  background_.PrepareFork();  // first: its holder takes the next two (export_side.h)
  mappings_.PrepareFork();
  keepalive_mutex_.PrepareFork();
  if (listener_ready()) listener_->PrepareFork();
}

void ExportSide::ParentAfterFork() noexcept {
  if (listener_ready()) listener_->ParentAfterFork();
  keepalive_mutex_.ParentAfterFork();
  mappings_.ParentAfterFork();
  background_.ParentAfterFork();
}

void ExportSide::AbandonAfterFork() {
  // The child's copies only: the parent keeps its keep-alive (and its memory).
  if (keepalive_mutex_.ChildAfterFork()) keepalive_fd_.Reset();
  if (!mappings_.CloseCachedFdsInForkedChild())
    VMMIPC_LOG_WARN(
        "forked child: the thread that forked was inside the exported-fd cache (a fork "
        "from a signal handler?); its copies of exported fds stay open in this process");
  if (listener_) {
    listener_->AbandonAfterFork();
    Park(listener_.release());
  }
}

}  // namespace vmmipc::core
