// The listener's workers: the job queue, its threads, their start and stop,
// the fds the queue holds, and a forked child's walk-away from them.
#include "transport/serve/listener/listener_workers.h"

#include <unistd.h>

#include <exception>

#include "common/log.h"
#include "common/parked.h"
#include "common/quiet_thread.h"
#include "transport/reaper/fd_reaper.h"

namespace vmmipc::transport {
namespace {

// The fds `job` holds: its connection and one per chunk (a task holds none).
size_t FdsOf(const ListenerJob& job) {
  return (job.request.fd.valid() ? 1 : 0) + job.reply.chunks.size();
}

}  // namespace

ListenerJob ListenerWorkers::TakeBack() {
  ListenerJob job = std::move(jobs_.back());
  jobs_.pop_back();
  queued_fds_.store(queued_fds() - FdsOf(job), std::memory_order_relaxed);
  return job;
}

void ListenerWorkers::Dispatch(ListenerJob job) noexcept {
  try {
    std::unique_lock lock(mutex_);
    if (stopping_) return;  // the job's connection closes with it
    const size_t fds = FdsOf(job);
    jobs_.push_back(std::move(job));
    queued_fds_.store(queued_fds() + fds, std::memory_order_relaxed);
    if (idle_workers_ == 0 && workers_.size() < max_workers_) {
      try {
        workers_.push_back(StartQuietThread("vmmipc-serve", [this] { Work(); }));
      } catch (const std::exception& e) {
        if (workers_.empty()) {
          ListenerJob inline_job = TakeBack();
          lock.unlock();
          VMMIPC_LOG_ERROR(
              "listener {}: cannot start a worker thread: {}; sending on the "
              "poll thread",
              context_->name, e.what());
          Run(inline_job);
          return;
        }
      }
    }
    lock.unlock();
    ready_.notify_one();
  } catch (...) {
    // Out of memory queueing the job: it is dropped, its connection closed.
  }
}

void ListenerWorkers::Work() noexcept {
  std::unique_lock lock(mutex_);
  while (true) {
    ++idle_workers_;
    ready_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
    --idle_workers_;
    if (stopping_) return;
    queued_fds_.store(queued_fds() - FdsOf(jobs_.front()), std::memory_order_relaxed);
    sending_.splice(sending_.end(), jobs_, jobs_.begin());
    const auto job = std::prev(sending_.end());
    lock.unlock();
    Run(*job);
    lock.lock();
    std::list<ListenerJob> done;
    done.splice(done.end(), sending_, job);
    // Its fds closed, its task's captures let go, without the lock.
    lock.unlock();
    done.clear();
    lock.lock();
  }
}

void ListenerWorkers::Run(ListenerJob& job) noexcept {
  if (!job.task) {
    SendReply(std::move(job.request), job.reply, *context_);
    return;
  }
  try {
    job.task();
  } catch (...) {
    VMMIPC_LOG_ERROR("listener {}: a posted task threw", context_->name);
  }
}

void ListenerWorkers::Stop() noexcept {
  std::list<ListenerJob> abandoned;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    abandoned.swap(jobs_);
    queued_fds_.store(0, std::memory_order_relaxed);
  }
  ready_.notify_all();
  // Workers in the middle of a reply see the stop fd and give up at once.
  for (auto& worker : workers_)
    if (worker->joinable()) worker->join();
  workers_.clear();
  for (ListenerJob& job : abandoned) CloseConnection(std::move(job.request.fd));
}

void ListenerWorkers::AbandonAfterFork() noexcept {
  // Kept reachable, never joined nor destroyed (as ever, whatever the lock).
  for (auto& worker : workers_) Park(worker.release());
  // False only when the thread that forked held the queue itself (a fork from
  // a signal handler): it may be half-updated; leave it, and its copies, alone.
  if (!mutex_.ChildAfterFork()) return;
  std::lock_guard lock(mutex_);
  // Plain closes of the child's copies: a shutdown() would end the parent's
  // connection. A connection with something queued stays open (until the
  // child's exec or exit): were the parent to close its copy meanwhile, ours
  // would be the close that frees a peer's queued fds, which may wait. The
  // jobs stay, never run: what a task holds is the parent's.
  for (ListenerJob& job : jobs_) {
    if (job.request.fd.valid() && NothingQueued(job.request.fd.get()))
      ::close(job.request.fd.Release());
    for (ChunkGrant& chunk : job.reply.chunks)
      if (chunk.fd.valid()) ::close(chunk.fd.Release());
  }
  // Only the chunks of a reply being sent: its connection was the worker's
  // (found by name with the listener's others).
  for (ListenerJob& job : sending_)
    for (ChunkGrant& chunk : job.reply.chunks)
      if (chunk.fd.valid()) ::close(chunk.fd.Release());
  queued_fds_.store(0, std::memory_order_relaxed);
}

}  // namespace vmmipc::transport
