// A lock-free list of parked objects, rooted in a global: reachable forever.
#include "common/parked.h"

#include <atomic>
#include <new>

namespace vmmipc {
namespace {

struct Node {
  const void* object;
  Node* next;
};

std::atomic<Node*> g_parked{nullptr};

}  // namespace

void Park(const void* object) noexcept {
  if (object == nullptr) return;
  Node* node = new (std::nothrow) Node{object, g_parked.load(std::memory_order_relaxed)};
  if (node == nullptr) return;  // then it is just leaked, as before
  while (!g_parked.compare_exchange_weak(node->next, node, std::memory_order_release,
                                         std::memory_order_relaxed)) {
  }
}

}  // namespace vmmipc
