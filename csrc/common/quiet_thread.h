// StartQuietThread: a std::thread that starts with every signal blocked and a
// name, for vmmipc's own threads inside a host process: the host's signal
// handlers must never run on them (they may assume their own threads).
#pragma once

#include <pthread.h>
#include <signal.h>

#include <memory>
#include <thread>
#include <utility>

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
      body();
    });
  } catch (...) {
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    throw;
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  return thread;
}

}  // namespace vmmipc
