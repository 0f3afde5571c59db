// ForkMutex and ForkSharedMutex: the locks a fork waits for. A forked child
// has only the thread that forked; a lock another thread held at the fork
// stays held there for ever, and what it guards may be half-updated. The
// child's cleanup (core/process_state.cc) must close its copies of the
// parent's exported fds and watch connections, which such locks guard: so
// the fork handler takes each of them before the fork (PrepareFork), and
// releases them after it, in the parent (ParentAfterFork) and in the child
// (ChildAfterFork, which then lets the cleanup take the lock as usual).
//
// Only for locks held for short critical sections, never across I/O, a
// driver call or a wait for another lock: a fork waits for each holder to
// finish. The one holder it must not wait for is its own thread (a signal
// handler that forks while its thread is inside such a section would wait
// for ever): each thread counts the fork locks it holds, and a fork from a
// thread that holds any takes none of them; its child then looks at each
// lock with a try-lock, as before these handlers existed.
//
// Drop-in for std::mutex and std::shared_mutex with std::lock_guard,
// std::unique_lock and std::shared_lock (not with std::condition_variable).
#pragma once

#include <mutex>
#include <new>
#include <shared_mutex>

namespace vmmipc {

namespace fork_lock_internal {
// Fork locks this thread holds, shared or exclusive.
inline thread_local int t_held = 0;
}  // namespace fork_lock_internal

// True when this thread holds a ForkMutex or ForkSharedMutex.
inline bool ThisThreadHoldsForkLocks() { return fork_lock_internal::t_held > 0; }

template <typename Mutex>
class BasicForkLock {
 public:
  void lock() {
    mutex_.lock();
    ++fork_lock_internal::t_held;
  }
  bool try_lock() {
    if (!mutex_.try_lock()) return false;
    ++fork_lock_internal::t_held;
    return true;
  }
  void unlock() {
    --fork_lock_internal::t_held;
    mutex_.unlock();
  }

  // The fork handlers', on the forking thread. Before the fork: takes the
  // lock (exclusive), waiting for its holders, unless this thread holds a
  // fork lock itself.
  void PrepareFork() noexcept {
    if (ThisThreadHoldsForkLocks()) return;
    mutex_.lock();
    taken_for_fork_ = true;
  }
  // In the parent after the fork: releases what PrepareFork took.
  void ParentAfterFork() noexcept {
    if (!taken_for_fork_) return;
    taken_for_fork_ = false;
    mutex_.unlock();
  }
  // In the child after the fork: true when what the lock guards may be
  // touched (the fork waited for its holders, or nobody held it), and the
  // lock is then free; false when a thread that no longer exists held it
  // (its data may be half-updated: leave it alone).
  bool ChildAfterFork() noexcept {
    if (taken_for_fork_) {
      // A new lock, not an unlock: an exclusive unlock by a thread whose id
      // changed at the fork (the child's) is not always read as one.
      new (&mutex_) Mutex();
      taken_for_fork_ = false;
      return true;
    }
    if (!mutex_.try_lock()) return false;
    mutex_.unlock();
    return true;
  }

 protected:
  Mutex mutex_;

 private:
  bool taken_for_fork_ = false;  // by PrepareFork; only the forking thread reads or writes it
};

class ForkMutex : public BasicForkLock<std::mutex> {};

class ForkSharedMutex : public BasicForkLock<std::shared_mutex> {
 public:
  void lock_shared() {
    mutex_.lock_shared();
    ++fork_lock_internal::t_held;
  }
  bool try_lock_shared() {
    if (!mutex_.try_lock_shared()) return false;
    ++fork_lock_internal::t_held;
    return true;
  }
  void unlock_shared() {
    --fork_lock_internal::t_held;
    mutex_.unlock_shared();
  }
};

}  // namespace vmmipc
