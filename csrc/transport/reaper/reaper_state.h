// The reaper's state, shared by its hand-over (fd_reaper.cc: the inbox, what
// is kept open, the public calls) and its threads (reaper_threads.cc: their
// start, the table they settle in, their disposals). Internal to the reaper.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <vector>

#include "transport/reaper/fd_reaper.h"

namespace vmmipc::transport::reaper_internal {

struct Reaper {
  std::mutex mutex;        // guards the fields below that say so
  bool started = false;    // guarded by mutex
  int inbox_send = -1;     // host table: CloseInBackground sends here (set under mutex, then fixed)
  int inbox_receive = -1;  // host table's copy of the other end (guarded by mutex)
  bool shared_only = false;                       // guarded by mutex: never try a private table
  std::atomic<bool> private_inbox_ready{false};   // the private table holds its own copy
  std::atomic<bool> private_table_failed{false};  // unshared, then could not get the inbox
  std::atomic<ReaperTable> table{ReaperTable::kNotStarted};
  // The first thread says where it settled (table above); its starter waits for that.
  std::mutex settled_mutex;
  std::condition_variable settled;
  std::atomic<size_t> threads{0};
  std::atomic<size_t> idle{0};
  std::atomic<size_t> pending{0};
  // Guarded by mutex: fds kept open in the host's table, never closed here.
  // `overflow`: handed over while the inbox was full, offered to it again
  // at later hand-overs; `forever`: KeepOpen's, never closed by anyone.
  // Room for kMaxKeptOpen of each is reserved when the reaper is made, so
  // that keeping one does not allocate.
  std::vector<int> overflow;
  std::vector<int> forever;
  size_t lost = 0;                // guarded by mutex: fds past even that, left open uncounted there
  bool keep_warned = false;       // guarded by mutex
  bool saturated_warned = false;  // guarded by mutex
};

// The one reaper, made on first use and never destroyed: the threads run
// until the process exits. A forked child forgets it (ResetReaperAfterFork).
extern std::atomic<Reaper*> g_reaper;
extern std::mutex g_create_mutex;
// The tests' hold point, called on a reaper thread with each fd before its disposal.
extern std::atomic<DisposalHook> g_disposal_hook;
Reaper& Get();

// reaper_threads.cc, under `reaper.mutex`: the inbox and the first thread
// (false when they cannot be made), and what a private table that failed
// leaves to do.
bool StartLocked(Reaper& reaper);
void ReplaceFailedPrivateThreadLocked(Reaper& reaper);
void CloseHostCopyOfInboxLocked(Reaper& reaper);

}  // namespace vmmipc::transport::reaper_internal
