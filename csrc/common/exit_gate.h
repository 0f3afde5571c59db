// The exit gate: vmmipc's own threads' driver calls and the process's exit.
// The driver tears itself down as the process exits (its own exit handlers);
// a call that one of vmmipc's threads (listener workers, the follow thread,
// the ahead worker, the background export) makes into that teardown crashes
// the host process, which did nothing wrong. So each such call passes the
// gate (ExitGatePass), and an exit handler closes it: it waits for the calls
// in progress to end, and every later one is refused without reaching the
// driver (the caller answers CUDA_ERROR_DEINITIALIZED, as a driver in its
// teardown does). The application's own threads never pass it: their calls
// at exit are the application's, as without vmmipc.
//
// The orders that can race, and what each gives:
//  - a pass vs the close: a pass counts itself in flight, then reads the
//    closed flag; the close sets the flag, then reads the count (all
//    seq_cst): so either the pass sees the gate closed and backs out, or the
//    close sees it in flight and waits for it. Every pass that ends (or
//    backs out) after the close wakes the closer, which looks at the count
//    again (under the gate's mutex, so that the wake cannot fall between its
//    look and its wait).
//  - the close vs the driver's teardown: the handler is registered with
//    std::atexit when vmmipc's first thread starts (never at load), after
//    the program has called into the driver, whose teardown is registered
//    at its initialization; exit handlers run in reverse order, so the gate
//    closes first. A driver that registered its teardown later than our
//    first thread would run it before the close.
//  - the close's wait has one bound for the whole exit (kExitBound): a call
//    that does not end within it is said in the log and the exit goes on.
//    A call the closing thread itself is inside is not waited for.
//  - fork: a forked child has none of the parent's other threads, so none
//    of their calls: the child's count is reset, its gate open (its exit is
//    its own), by a pthread_atfork handler registered with the exit handler.
//    The gate's mutex is taken only once the gate is closed (a pass's end
//    or back-out after the close, the close itself), so a fork before the
//    exit never leaves it held in the child.
#pragma once

#include <chrono>

namespace vmmipc {

// How long an exit waits, in all, for vmmipc's calls in progress.
inline constexpr std::chrono::milliseconds kExitBound{5000};

// Marks the calling thread as one of vmmipc's (StartQuietThread's threads
// do so first) and arms the exit handler, once per process.
void MarkVmmipcThread() noexcept;
// Whether the calling thread is one of vmmipc's.
bool OnVmmipcThread() noexcept;

// Driver work past the gate, one call or an operation of several: open() is
// false once the process exits (then the work must not begin). A pass taken
// inside another of the same thread's is always open: the close waits for
// the outer one, and its work must run to its end.
class ExitGatePass {
 public:
  ExitGatePass() noexcept;
  ~ExitGatePass();
  ExitGatePass(const ExitGatePass&) = delete;
  ExitGatePass& operator=(const ExitGatePass&) = delete;
  bool open() const { return open_; }

 private:
  bool open_;
};

// Whether the gate is closed (the process exits): whether a refused status
// was the gate's (core/real.h RefusedAtExit).
bool ExitGateClosed() noexcept;

// The exit handler's work: closes the gate and waits for the passes in
// progress (but the caller's own) to end, at most `bound`. True when none
// was left; false, logged, when some still were at the bound.
bool CloseExitGate(std::chrono::milliseconds bound = kExitBound) noexcept;

// Tests: opens the gate again (no pass may be in progress).
void ReopenExitGateForTests() noexcept;

}  // namespace vmmipc
