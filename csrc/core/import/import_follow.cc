// The import side's follow part: its follower id, the watch requests in
// flight, the watch client, and the client's fork handling.
#include "core/import/import_follow.h"

#include <chrono>

#include "common/parked.h"
#include "common/random.h"

namespace vmmipc::core {

uint32_t ImportFollow::follower_id() {
  std::lock_guard<std::mutex> lock(follow_mutex_);
  while (follower_id_ == 0) {
    // Unguessable, so that no other process can claim this one's grants;
    // without randomness only unique (it then names grants, it guards nothing).
    if (!FillRandom(&follower_id_, sizeof(follower_id_)))
      FillUnique(&follower_id_, sizeof(follower_id_));
  }
  return follower_id_;
}

bool ImportFollow::StartWatch(uint64_t tag, Timeout timeout) {
  std::unique_lock<std::mutex> lock(follow_mutex_);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout.ms());
  while (watch_requests_.count(tag) != 0)
    if (watch_ended_.wait_until(lock, until) == std::cv_status::timeout) return false;
  if (watch_client_ && watch_client_->Has(tag)) return false;
  watch_requests_.insert(tag);
  return true;
}

bool ImportFollow::Watches(uint64_t tag) {
  std::lock_guard<std::mutex> lock(follow_mutex_);
  return watch_client_ && watch_client_->Has(tag);
}

void ImportFollow::EndWatch(uint64_t tag) {
  {
    std::lock_guard<std::mutex> lock(follow_mutex_);
    watch_requests_.erase(tag);
  }
  watch_ended_.notify_all();
}

void ImportFollow::PrepareFork() noexcept {
  if (transport::WatchClient* client = watch_client_for_fork_.load(std::memory_order_acquire))
    client->PrepareFork();
}

void ImportFollow::ParentAfterFork() noexcept {
  if (transport::WatchClient* client = watch_client_for_fork_.load(std::memory_order_acquire))
    client->ParentAfterFork();
}

void ImportFollow::AbandonAfterFork() noexcept {
  // Not watch_client_: a fork in the middle of AddWatch may have left it half
  // written. A client made but not yet published holds no connection.
  transport::WatchClient* client = watch_client_for_fork_.load(std::memory_order_acquire);
  if (client == nullptr) return;
  client->AbandonAfterFork();
  Park(watch_client_.release());
}

}  // namespace vmmipc::core
