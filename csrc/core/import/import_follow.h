// ImportFollow: the import side's part of follow (VMMIPC_FOLLOW=1): this
// process's follower id, the watch connections it keeps to its exporters
// (the watch client and its thread), and the opens asking for one.
//
// Locking:
//  - follow_mutex_ guards the watch client's creation and its lookups and
//    the watch requests in flight; the client is never destroyed, and
//    follow_context_ is written once, before the client (and its thread)
//    exists. follow_mutex_ is held across the client's making (a driver
//    call): the fork handlers never take it, and reach the client through
//    watch_client_for_fork_ instead.
//  - Fork: the watch client's own lock is a fork lock (common/fork_lock.h),
//    taken by the fork handler (PrepareFork) after the export side's, so that
//    a forked child can always close its copies of the watch connections.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "common/timeout.h"
#include "transport/client/watch_client.h"

namespace vmmipc::core {

class ImportFollow {
 public:
  // This process's follower id (random, never 0): the exporters record what
  // they grant it, and keep its watch connection, under it.
  uint32_t follower_id();
  // True when this open should ask exporter `tag` for a watch connection:
  // none is kept and no other open asks for one (one that does is waited
  // for, at most `timeout`, so that a grant never precedes the watch
  // connection it is told on). A true answer must be followed by EndWatch.
  bool StartWatch(uint64_t tag, Timeout timeout);
  // The open that asked for a watch is done (KeepWatch ran, or it failed).
  void EndWatch(uint64_t tag);
  // True when a watch connection to exporter `tag` is kept.
  bool Watches(uint64_t tag);
  // Keeps `connection` for exporter `tag`. The first call makes the watch
  // client with `make(&context)`, which writes the context its thread uses
  // first. False, with `*error`, when the client cannot keep it.
  template <typename Make>
  bool AddWatch(uint64_t tag, transport::WatchConnection connection, Make make,
                std::string* error) {
    std::lock_guard<std::mutex> lock(follow_mutex_);
    if (!watch_client_) {
      watch_client_ = make(&follow_context_);
      watch_client_for_fork_.store(watch_client_.get(), std::memory_order_release);
    }
    return watch_client_->Add(tag, std::move(connection), error);
  }
  // The context current at the first kept watch, for the follow thread.
  void* follow_context() const { return follow_context_; }

  // The fork handlers' (core/process_state.cc): before a fork, takes the watch
  // client's lock (waiting for its holder); after it, releases it in the parent.
  void PrepareFork() noexcept;
  void ParentAfterFork() noexcept;
  // In a forked child: abandons the watch client, whose thread is the parent's,
  // and closes its copies of the connections.
  void AbandonAfterFork() noexcept;

 private:
  std::mutex follow_mutex_;
  std::condition_variable watch_ended_;
  std::set<uint64_t> watch_requests_;  // exporters a watch is being asked of
  std::unique_ptr<transport::WatchClient> watch_client_;
  // The client once made, for the fork handlers, which take no lock to find it.
  std::atomic<transport::WatchClient*> watch_client_for_fork_{nullptr};
  void* follow_context_ = nullptr;
  uint32_t follower_id_ = 0;
};

}  // namespace vmmipc::core
