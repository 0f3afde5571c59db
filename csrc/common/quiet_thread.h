// StartQuietThread: a std::thread that starts with every signal blocked and a
// name, for vmmipc's own threads inside a host process: the host's signal
// handlers must never run on them (they may assume their own threads), and
// whose driver calls pass the exit gate (common/exit_gate.h). And
// StopQuietThread: the end of such a worker that waits on a condition.
#pragma once

#include <pthread.h>
#include <signal.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "common/exit_gate.h"

namespace vmmipc {

// Throws what std::thread throws (std::system_error) when no thread can start.
template <typename Body>
std::unique_ptr<std::thread> StartQuietThread(const char* name, Body body) {
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);  // the new thread inherits this mask
  std::unique_ptr<std::thread> thread;
  try {
    thread = std::make_unique<std::thread>([name, body = std::move(body)]() mutable {
      pthread_setname_np(pthread_self(), name);
      MarkVmmipcThread();  // its driver calls pass the exit gate
      body();
    });
  } catch (...) {
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    throw;
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  return thread;
}

// Sets `*stop` under `mutex`, wakes every waiter of `wake`, and joins
// `*thread` (taken out under the lock, joined outside it) if one started.
inline void StopQuietThread(std::mutex& mutex, std::condition_variable& wake, bool* stop,
                            std::unique_ptr<std::thread>* thread) {
  std::unique_ptr<std::thread> ending;
  {
    std::lock_guard<std::mutex> lock(mutex);
    *stop = true;
    wake.notify_all();
    ending = std::move(*thread);
  }
  if (ending && ending->joinable()) ending->join();
}

}  // namespace vmmipc
