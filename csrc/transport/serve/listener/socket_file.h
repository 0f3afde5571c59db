// A listener's socket file (VMMIPC_SOCKET_DIR): the inode its bind() made,
// and that file's removal at a clean stop and at the process's exit, only
// while the path still names that inode (a file that replaced ours is never
// removed). A process that dies without exiting (a signal, _exit) leaves its
// file; the next listener of that name finds nobody listening on it and
// removes it (listener_socket.cc). Exit: an atexit handler, registered with the
// first socket file (never at load), walks a fixed table of the process's
// files; no lock and no allocation, since at exit the process's other
// threads still run (the listener's among them) and may hold any lock. A
// forked child never removes its parent's file: the table records the pid.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace vmmipc::transport {

class BoundSocketFile {
 public:
  BoundSocketFile() = default;
  BoundSocketFile(const BoundSocketFile&) = delete;
  BoundSocketFile& operator=(const BoundSocketFile&) = delete;
  // The file stays: Remove() or Forget() say what becomes of it.
  ~BoundSocketFile() = default;

  // Right after bind(): `path` names the socket file it made. Remembers its
  // inode and has the process's exit remove it. False when the path is not
  // a socket any more (replaced right after bind) or cannot be looked at:
  // then nothing is ever removed. Never throws.
  bool Adopt(const std::string& path) noexcept;
  // Removes the file if the path still names the inode adopted; not at exit
  // either, then. Idempotent.
  void Remove() noexcept;
  // A forked child: the file is the parent's, never removed from here.
  void Forget() noexcept;

  bool adopted() const noexcept { return adopted_; }

 private:
  bool adopted_ = false;
  int slot_ = -1;          // in the exit table; -1 when it was full
  uint64_t sequence_ = 0;  // the slot's claim this file holds
  std::string path_;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

}  // namespace vmmipc::transport
