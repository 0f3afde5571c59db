// What a listener is started with (listener.h): the process's secret, pid
// and instance, where its socket lives, its timeout and worker count, whether
// it keeps watch connections, and the events it reports.
#pragma once

#include <cstdint>
#include <string>

#include "common/timeout.h"
#include "transport/serve/serve_handler.h"
#include "transport/serve/watch/watchers.h"
#include "transport/siphash.h"

namespace vmmipc::transport {

struct ListenerOptions {
  SipKey secret;     // this process's secret: handles' capabilities are made under it
  uint32_t pid = 0;  // this process's pid as it appears in handles
  // This process's public instance id (in every handle), which names the
  // socket; 0: the pid names it, as before handle version 3 (tests).
  uint32_t instance = 0;
  std::string socket_dir;      // empty: abstract socket
  Timeout timeout;             // per connection: receive, send
  int max_workers = 4;         // worker threads, started as needed; below 1: 1, with a warning
  bool keep_watchers = false;  // keep the connections of requests that ask to watch
  ResumeFdSource resume_fd;    // with keep_watchers: fds for a lagging follower's catch-up
  ListenerEvents events;
};

}  // namespace vmmipc::transport
