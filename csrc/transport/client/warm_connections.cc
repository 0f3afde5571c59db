// The pool of warm connections (warm_connections.h): a short list behind a
// fork lock, scanned linearly (it holds a few dozen at most).
#include "transport/client/warm_connections.h"

#include <poll.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <new>
#include <vector>

#include "common/fork_lock.h"
#include "common/syscall.h"
#include "transport/reaper/fd_reaper.h"

namespace vmmipc::transport {
namespace {

struct Entry {
  std::string name;
  ScopedFd fd;
  uint64_t last_use = 0;  // the pool's clock: higher is more recent
};

// A connection a fetch uses (ConnectionInUse): its number and its socket's
// inode, which tell the child whether that number is still this connection,
// and the thread using it (the one that forks, from a signal handler that
// interrupted its own fetch, goes on using it in the child).
struct InUse {
  uint64_t id = 0;
  int fd = -1;
  dev_t dev = 0;
  ino_t ino = 0;
  pthread_t thread{};
};

struct Pool {
  // Held only to read or write the list (and one poll(0) per connection
  // taken), never across a close: closes that may go to the reaper happen
  // after it is released.
  ForkMutex mutex;
  std::vector<Entry> entries;
  std::vector<InUse> in_use;
  uint64_t in_use_ids = 0;
  uint64_t clock = 0;
  WarmConnectionStats stats;
};

// Made on the first keep (never at load), then kept for the process's life:
// a fetch on another thread may be using it at exit.
std::atomic<Pool*> g_pool{nullptr};

Pool& ThePool() {
  static Pool* pool = [] {
    Pool* made = new Pool();
    g_pool.store(made, std::memory_order_release);
    return made;
  }();
  return *pool;
}

// True when nothing is queued on `fd` and its exporter has not hung up: a
// request sent on it now reaches a listener that reads it. A message queued
// before any request is none of ours (a hostile or broken exporter), and one
// poll(0) costs far less than a connect.
bool FitForRequest(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  const int n = RetryOnEintr([&] { return ::poll(&p, 1, 0); });
  return n == 0;
}

}  // namespace

ScopedFd TakeWarmConnection(const std::string& name) noexcept {
  Pool* pool = g_pool.load(std::memory_order_acquire);
  if (pool == nullptr) return {};
  std::vector<ScopedFd> unfit;
  ScopedFd taken;
  {
    std::lock_guard<ForkMutex> lock(pool->mutex);
    // The most recently used first: the one least likely to have idled out.
    while (!taken.valid()) {
      auto best = pool->entries.end();
      for (auto it = pool->entries.begin(); it != pool->entries.end(); ++it) {
        if (it->name == name && (best == pool->entries.end() || it->last_use > best->last_use))
          best = it;
      }
      if (best == pool->entries.end()) break;
      ScopedFd fd = std::move(best->fd);
      pool->entries.erase(best);
      if (FitForRequest(fd.get())) {
        taken = std::move(fd);
        ++pool->stats.reused;
      } else {
        ++pool->stats.discarded;
        try {
          unfit.push_back(std::move(fd));
        } catch (...) {
          ::close(fd.Release());  // out of memory: nothing queued was taken, a plain close
        }
      }
    }
    pool->stats.kept = pool->entries.size();
  }
  // After the lock, which a fork waits for: a close may go through the reaper.
  for (ScopedFd& fd : unfit) CloseConnection(std::move(fd));
  return taken;
}

void KeepWarmConnection(const std::string& name, ScopedFd connection, size_t limit) noexcept {
  if (!connection.valid()) return;
  ScopedFd evicted;
  try {
    Pool& pool = ThePool();
    std::lock_guard<ForkMutex> lock(pool.mutex);
    const auto of_name = static_cast<size_t>(std::count_if(
        pool.entries.begin(), pool.entries.end(), [&](const Entry& e) { return e.name == name; }));
    if (limit == 0 || of_name >= kWarmPerExporter) {
      evicted = std::move(connection);
      ++pool.stats.evicted;
    } else {
      if (pool.entries.size() >= limit) {
        auto oldest = std::min_element(
            pool.entries.begin(), pool.entries.end(),
            [](const Entry& a, const Entry& b) { return a.last_use < b.last_use; });
        evicted = std::move(oldest->fd);
        pool.entries.erase(oldest);
        ++pool.stats.evicted;
      }
      pool.entries.push_back(Entry{name, std::move(connection), ++pool.clock});
    }
    pool.stats.kept = pool.entries.size();
  } catch (...) {
    // Out of memory: the connection is not kept.
    if (connection.valid()) evicted = std::move(connection);
  }
  CloseConnection(std::move(evicted));
}

void ConnectionInUse::Note(int fd) noexcept {
  Forget();
  if (fd < 0) return;
  // A socket's inode: fstat never reaches a filesystem's daemon here.
  struct stat st {};
  if (::fstat(fd, &st) != 0) return;
  try {
    Pool& pool = ThePool();
    std::lock_guard<ForkMutex> lock(pool.mutex);
    const uint64_t id = ++pool.in_use_ids;
    pool.in_use.push_back(InUse{id, fd, st.st_dev, st.st_ino, ::pthread_self()});
    id_ = id;
  } catch (...) {
    // Out of memory: not recorded (warm_connections.h).
  }
}

void ConnectionInUse::Forget() noexcept {
  if (id_ == 0) return;
  Pool* pool = g_pool.load(std::memory_order_acquire);
  if (pool != nullptr) {
    std::lock_guard<ForkMutex> lock(pool->mutex);
    std::erase_if(pool->in_use, [&](const InUse& u) { return u.id == id_; });
  }
  id_ = 0;
}

void CloseWarmConnections() noexcept {
  Pool* pool = g_pool.load(std::memory_order_acquire);
  if (pool == nullptr) return;
  std::vector<Entry> entries;
  {
    std::lock_guard<ForkMutex> lock(pool->mutex);
    entries.swap(pool->entries);
    pool->stats.kept = 0;
  }
  for (Entry& e : entries) CloseConnection(std::move(e.fd));
}

void WarmConnectionsPrepareFork() noexcept {
  if (Pool* pool = g_pool.load(std::memory_order_acquire)) pool->mutex.PrepareFork();
}

void WarmConnectionsParentAfterFork() noexcept {
  if (Pool* pool = g_pool.load(std::memory_order_acquire)) pool->mutex.ParentAfterFork();
}

void WarmConnectionsAfterForkInChild() noexcept {
  Pool* pool = g_pool.load(std::memory_order_acquire);
  if (pool == nullptr) return;
  // False only when the thread that forked held the lock itself (a signal
  // handler's fork): the list may be half-updated, leave the copies open.
  if (!pool->mutex.ChildAfterFork()) return;
  std::lock_guard<ForkMutex> lock(pool->mutex);
  // Plain closes of the child's copies: the parent holds the same
  // connections, so none of these closes is the last one (nothing queued
  // is released here), and shutdown() would end the parent's connections.
  for (Entry& e : pool->entries) ::close(e.fd.Release());
  pool->entries.clear();
  // The connections fetches were using: their threads do not exist here.
  // Closed only where the number is still that connection (it may have been
  // closed, and the number reused, just before the fork).
  for (const InUse& u : pool->in_use) {
    if (::pthread_equal(u.thread, ::pthread_self()) != 0) continue;  // its fetch goes on here
    struct stat st {};
    if (::fstat(u.fd, &st) == 0 && st.st_dev == u.dev && st.st_ino == u.ino) ::close(u.fd);
  }
  pool->in_use.clear();
  pool->stats = WarmConnectionStats{};
}

WarmConnectionStats WarmConnectionStatsNow() noexcept {
  Pool* pool = g_pool.load(std::memory_order_acquire);
  if (pool == nullptr) return {};
  std::lock_guard<ForkMutex> lock(pool->mutex);
  return pool->stats;
}

}  // namespace vmmipc::transport
