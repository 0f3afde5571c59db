// The log file's open and its checks (log.cc's): a regular file of this
// user's own, with one name, that neither group nor others can write, opened
// without ever waiting (O_NONBLOCK, O_NOFOLLOW) and then checked on the fd.
#pragma once

#include <string>

namespace vmmipc::log {

// Opens the log file at `path` (`shown`: how lines name it); -1 and `why`
// when it cannot, or must not, be used. Without `create`, a file that is not
// there is not made: -1, `why` empty, and errno ENOENT (FileProblem asks).
//
// Runs under g_create_mutex and under whatever lock the caller of the first
// line holds: config::Get()'s once flag (and core::Active's static guard),
// which opens it as the configuration is read (OpenFile), or, in a forked
// child with %p, the caller of the child's first line (a placement lock, the
// process state's creation mutex). So it must never wait: O_NONBLOCK makes
// the open of a FIFO without a reader fail at once (ENXIO) rather than wait
// for one, and that of a file under another process's lease fail
// (EWOULDBLOCK) rather than wait for the lease to break; O_NOFOLLOW makes a
// symbolic link fail (ELOOP) rather than lead elsewhere. What was opened is
// then checked on the fd (Refusal), never by name again, so no rename in
// between can swap it; a FIFO that has a reader is refused there, and no
// later write can wait on a reader either.
int OpenLogPath(const std::string& path, const std::string& shown, bool create, std::string* why);

}  // namespace vmmipc::log
