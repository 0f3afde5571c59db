// The listener's socket: made non-blocking and CLOEXEC, bound to its name
// (on a filesystem path: a stale file of a dead process cleared first, the
// dead files of the directory swept, the file 0600 from birth, bound under a
// ".bind" name and given its own once it listens, then adopted for its
// removal: socket_file.h), asked to refuse fds sent to it, and listening. Owns nothing after it
// returns: the listener holds the fd and the socket file.
#pragma once

#include <string>

#include "common/scoped_fd.h"
#include "transport/serve/listener/socket_file.h"
#include "transport/socket_address.h"

namespace vmmipc::transport {

// Makes the listening socket of `address` into `*fd`; a filesystem socket's
// file is adopted by `*file` once bound (removed at its Stop, at exit). False
// with `*error` filled when the socket cannot be made, bound or listened on
// (what was made so far stays in `*fd` and `*file` for their owner to close).
bool BindListeningSocket(const SocketAddress& address, ScopedFd* fd, BoundSocketFile* file,
                         std::string* error);

// Tests only: called on a filesystem socket's start after its bind and
// before it listens (with the name it will get), a hold point for what
// another process may do meanwhile.
void SetBoundHookForTesting(void (*hook)(const std::string& path));

}  // namespace vmmipc::transport
