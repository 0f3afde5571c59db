// The listener's worker pool: threads, started as needed up to a bound, that
// send the replies too long for the poll thread (their sends may wait on a
// peer that does not read) and run the tasks posted with Listener::Post, in
// the order they came. A reply in progress gives up as soon as the
// listener's stop fd is readable. Owns the job queue and its threads; what a
// reply is and how it is sent is serve_connection.h's. A queued reply holds
// its connection and its chunks' fds: the queue counts them, for the fd
// budget (admission.h, which refuses a reply past its share), and a forked
// child closes its copies of them.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <thread>
#include <vector>

#include "common/fork_lock.h"
#include "transport/serve/serve_connection.h"
#include "transport/serve/serve_handler.h"

namespace vmmipc::transport {

struct ListenerJob {
  PendingRequest request;
  ServeReply reply;            // prepared on the poll thread: only to be sent
  std::function<void()> task;  // set instead of a request for Listener::Post
};

class ListenerWorkers {
 public:
  // Before the first Dispatch. `context` (the listener's) outlives the pool.
  void Configure(const ServeContext* context, int max_workers) noexcept {
    context_ = context;
    max_workers_ = static_cast<size_t>(max_workers);
  }

  // Queues `job` for a worker, starting one if none is idle and the bound
  // allows. Without any worker (none could start) it runs on this thread.
  // After Stop, or out of memory, the job is dropped and its connection closed.
  void Dispatch(ListenerJob job) noexcept;
  // The fds the queued jobs hold (their connections and chunks), not yet
  // taken by a worker. Only Dispatch adds to it: read by the poll thread,
  // which alone queues replies, it is a bound on what the queue holds until
  // its next Dispatch.
  size_t queued_fds() const noexcept { return queued_fds_.load(std::memory_order_relaxed); }
  // Once the listener's stop fd is readable: wakes and joins every worker
  // (one in a reply gives up at once), then closes the connections of the
  // jobs left in the queue. Later jobs are dropped.
  void Stop() noexcept;
  // The fork handlers' (Listener::PrepareFork): the queue's fork lock before
  // a fork, released after it in the parent.
  void PrepareFork() noexcept { mutex_.PrepareFork(); }
  void ParentAfterFork() noexcept { mutex_.ParentAfterFork(); }
  // A forked child: the threads do not exist there; they are leaked, never
  // joined. The child's copies of the queued replies' fds (connections and
  // chunks) and of the chunk fds of the replies being sent are closed; the
  // jobs never run. The connections being answered go with the listener's
  // others (ListenerImpl::Abandon).
  void AbandonAfterFork() noexcept;

 private:
  void Work() noexcept;
  // Runs the job at `job` (in sending_), without the lock.
  void Run(ListenerJob& job) noexcept;
  // The back of the queue, taken back (no worker could start for it).
  ListenerJob TakeBack();

  const ServeContext* context_ = nullptr;
  size_t max_workers_ = 1;
  // Guarded by mutex_: jobs_, sending_, workers_, idle_workers_, stopping_,
  // and every write of queued_fds_. Never held across I/O, a log line, a
  // close or the handler.
  // A fork lock (common/fork_lock.h): a fork waits for its holder, so that a
  // forked child finds the queue whole and closes its copies of its fds.
  ForkMutex mutex_;
  std::condition_variable_any ready_;  // ForkMutex is not std::mutex
  std::atomic<size_t> queued_fds_{0};
  std::list<ListenerJob> jobs_;
  // The jobs the workers run now, moved here from jobs_ (a splice: no
  // allocation) and out again under the lock: a reply's chunk fds are only
  // read meanwhile, and closed once out, so that a forked child finds every
  // one here still open in the parent.
  std::list<ListenerJob> sending_;
  // Heap-held so that a forked child can leak them: destroying a joinable
  // std::thread calls std::terminate, and joining a thread that does not
  // exist in the child would hang.
  std::vector<std::unique_ptr<std::thread>> workers_;
  size_t idle_workers_ = 0;
  bool stopping_ = false;
};

}  // namespace vmmipc::transport
