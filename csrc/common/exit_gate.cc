// The exit gate's count, its flag and its one exit handler (exit_gate.h
// says the orders).
#include "common/exit_gate.h"

#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>

#include "common/log.h"

namespace vmmipc {
namespace {

thread_local bool t_vmmipc_thread = false;
// Passes the calling thread holds (a close from inside one must not wait for it).
thread_local int t_passes = 0;

constinit std::atomic<int> g_in_flight{0};
constinit std::atomic<bool> g_closed{false};
constinit std::atomic<bool> g_armed{false};
// Never destroyed: an exit handler and the last pass out use them at exit.
std::mutex& GateMutex() {
  static auto* mutex = new std::mutex;
  return *mutex;
}
std::condition_variable& GateWake() {
  static auto* wake = new std::condition_variable;
  return *wake;
}

void CloseAtExit() { (void)CloseExitGate(); }

// After a pass ends once the gate is closed: the closer looks at the count
// again (every end, not only the last: the closer may hold passes of its
// own). Under the mutex, so that the wake cannot fall between its look and
// its wait.
void WakeTheCloser() {
  std::lock_guard<std::mutex> lock(GateMutex());
  GateWake().notify_all();
}

// The child has only the forking thread: no other thread's pass is in
// progress there, and the forking thread holds none (vmmipc's threads never
// fork). Its exit is its own, whenever the parent's comes. The mutex needs
// nothing: it is taken only once the gate is closed, at exit.
void ResetInForkedChild() {
  g_in_flight.store(0);
  g_closed.store(false);
}

}  // namespace

void MarkVmmipcThread() noexcept {
  t_vmmipc_thread = true;
  if (g_armed.exchange(true)) return;
  (void)GateMutex();
  (void)GateWake();
  if (pthread_atfork(nullptr, nullptr, ResetInForkedChild) != 0 || std::atexit(CloseAtExit) != 0)
    VMMIPC_LOG_WARN(
        "exit gate: no exit or fork handler could be registered; a driver call of vmmipc's "
        "in progress at exit may meet the driver's teardown");
}

bool OnVmmipcThread() noexcept { return t_vmmipc_thread; }

ExitGatePass::ExitGatePass() noexcept {
  g_in_flight.fetch_add(1);  // before the flag is read (the header)
  // A pass within one of this thread's is part of work the close waits for.
  open_ = t_passes > 0 || !g_closed.load();
  if (open_) {
    ++t_passes;
    return;
  }
  // Backs out; the closer may have counted it.
  g_in_flight.fetch_sub(1);
  WakeTheCloser();
}

ExitGatePass::~ExitGatePass() {
  if (!open_) return;
  --t_passes;
  g_in_flight.fetch_sub(1);
  if (g_closed.load()) WakeTheCloser();
}

bool ExitGateClosed() noexcept { return g_closed.load(); }

bool CloseExitGate(std::chrono::milliseconds bound) noexcept {
  g_closed.store(true);  // before the count is read (the header)
  const int own = t_passes;
  std::unique_lock<std::mutex> lock(GateMutex());
  if (GateWake().wait_for(lock, bound, [own] { return g_in_flight.load() <= own; })) return true;
  VMMIPC_LOG_WARN(
      "exit gate: {} driver call(s) of vmmipc's threads still in progress after {} ms; the "
      "exit goes on",
      g_in_flight.load() - own, bound.count());
  return false;
}

void ReopenExitGateForTests() noexcept { g_closed.store(false); }

}  // namespace vmmipc
