// Creation of the process state and its reset in forked children.
#include "core/process_state.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>

#include "common/log.h"
#include "common/parked.h"
#include "common/random.h"
#include "common/syscall.h"
#include "config/params.h"
#include "core/stats.h"
#include "transport/client/warm_connections.h"
#include "transport/reaper/fd_reaper.h"

namespace vmmipc::core {
namespace {

std::atomic<ProcessState*> g_state{nullptr};
std::mutex g_create_mutex;

// The secret under which this process's handles are made, and its public
// instance id (never 0). The secret comes from the kernel's randomness or not
// at all: one made from the clock and pid could be guessed, and with it every
// handle's capability. Without it exports are refused
// (core/export/export_listener.cc StartListener says why); imports need none.
// The instance is public anyway (in every handle): it must only differ from
// that of an earlier process of the same pid, which FillUnique's clocks give
// even without randomness.
void NewIdentity(Identity* self) {
  uint64_t key[2] = {};
  self->has_secret = FillRandom(key, sizeof(key), &self->no_secret);
  self->secret = self->has_secret ? transport::SipKey{key[0], key[1]} : transport::SipKey{};
  if (self->has_secret && self->no_secret.getrandom_error != 0)
    VMMIPC_LOG_DEBUG("getrandom failed ({}): this process's handle secret comes from /dev/urandom",
                     ErrnoText(self->no_secret.getrandom_error));
  uint32_t instance = 0;
  FillUnique(&instance, sizeof(instance));
  self->instance = instance != 0 ? instance : 1;
}

ProcessState* Create() {
  const config::Params& params = config::Get();
  log::SetLevel(params.log_level);
  // Again here for a forked child, whose parent may have logged a slot from the GPU.
  log::SetRank(static_cast<int>(params.rank));
  // Once per process (and per forked child): what this process runs with.
  VMMIPC_LOG_INFO("{}", config::Describe(params));
  auto* state = new ProcessState();  // never freed, on purpose
  state->identity.pid = static_cast<uint32_t>(getpid());
  NewIdentity(&state->identity);
  state->identity.rank = static_cast<int32_t>(params.rank);
  stats::EnableExitReportIfConfigured();
  return state;
}

// The fork handlers. A forked child has only the thread that forked, and
// must close its copies of the parent's exported fds and watch connections
// (they would keep the parent's memory, and its importers' connections,
// alive for the child's life): the locks that guard them are fork locks
// (common/fork_lock.h), which BeforeFork takes on the forking thread, waiting
// for any other thread inside them, and which the parent and the child
// release after the fork. Taken in this order: the background export's export lock, the
// mapping table (the exported-fd cache), the export keep-alive, the listener's watch list, the
// listener's job queue, the watch client's connections, the importer's warm connections. Each is
// held only to read or write what it guards, never across I/O, a driver call or another lock, so
// its holder always leaves it, and no thread ever holds two: no order of taking them can deadlock
// with one. The one exception is the first: the background export's thread holds it across one
// export, and inside it the table's and the keep-alive's locks, so it is taken first, in that
// same order; a fork waits for at most that one export (core/export/background_export.h). The
// other locks of the state (the listener's start, the warm-up,
// placement, the driver's) are held across driver calls or I/O, and the child never touches what
// they guard. A state created between BeforeFork and the fork has its fork locks untaken; their
// ParentAfterFork and ChildAfterFork know it.
void BeforeFork() {
  ProcessState* state = g_state.load(std::memory_order_acquire);
  if (state == nullptr) return;
  state->exporter.PrepareFork();
  state->importer.follow().PrepareFork();
  transport::WarmConnectionsPrepareFork();
}

void AfterForkInParent() {
  ProcessState* state = g_state.load(std::memory_order_acquire);
  if (state == nullptr) return;
  transport::WarmConnectionsParentAfterFork();
  state->importer.follow().ParentAfterFork();
  state->exporter.ParentAfterFork();
}

// In the child only one thread exists; the parent's listener thread and its
// sockets are gone or shared with the parent. Close the child's copies of
// the parent's fds, then start afresh and leak the old state rather than
// touch its other locks, which may be held.
void AfterForkInChild() {
  log::ResetAfterFork();
  stats::ResetAfterFork();
  transport::ResetReaperAfterFork();
  transport::WarmConnectionsAfterForkInChild();
  ProcessState* old = g_state.load(std::memory_order_relaxed);
  if (old != nullptr) {
    old->exporter.AbandonAfterFork();
    old->importer.follow().AbandonAfterFork();
  }
  Park(old);  // leaked, but reachable: leak checkers must not fail the child's exit
  new (&g_create_mutex) std::mutex();
  g_state.store(nullptr, std::memory_order_release);
}

}  // namespace

ProcessState& State() {
  ProcessState* state = g_state.load(std::memory_order_acquire);
  if (state != nullptr) return *state;
  std::lock_guard<std::mutex> lock(g_create_mutex);
  state = g_state.load(std::memory_order_relaxed);
  if (state == nullptr) {
    static std::once_flag fork_handler_once;
    std::call_once(fork_handler_once,
                   [] { pthread_atfork(BeforeFork, AfterForkInParent, AfterForkInChild); });
    state = Create();
    g_state.store(state, std::memory_order_release);
  }
  return *state;
}

Identity& OwnIdentity() { return State().identity; }
ExportSide& Exporter() { return State().exporter; }
ArenaSide& Arena() { return State().exporter.arena(); }
ImportSide& Importer() { return State().importer; }

}  // namespace vmmipc::core
