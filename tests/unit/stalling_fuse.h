// A FUSE filesystem whose daemon stops answering (tests): mounted straight
// through /dev/fuse (no libfuse, no fusermount), one regular file "f" whose
// attributes are never cached (every fstat asks the daemon), answered until
// Stall(); from then on every request is read, counted and never answered, as
// a daemon that hangs. Abort() ends the connection (what waits on it fails),
// unmounts and removes the mount point. Unavailable (Mount() false, with why)
// without /dev/fuse or the right to mount: the caller skips.
#pragma once

#include <fcntl.h>
#include <linux/fuse.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace vmmipc::testing {

class StallingFuse {
 public:
  ~StallingFuse() { Abort(); }

  bool Mount(std::string* why) {
    char dir[] = "/tmp/vmmipc-fuse-XXXXXX";
    if (mkdtemp(dir) == nullptr) return Fail(why, "mkdtemp");
    dir_ = dir;
    dev_ = ::open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (dev_ < 0) return Fail(why, "open /dev/fuse");
    const std::string options = "fd=" + std::to_string(dev_) +
                                ",rootmode=40000,user_id=" + std::to_string(geteuid()) +
                                ",group_id=" + std::to_string(getegid());
    if (::mount("vmmipc-stall", dir_.c_str(), "fuse.vmmipc-stall", MS_NOSUID | MS_NODEV,
                options.c_str()) != 0)
      return Fail(why, "mount");
    mounted_ = true;
    daemon_ = std::thread([this] { Serve(); });
    return true;
  }
  std::string file() const { return dir_ + "/f"; }
  // A forked child: its copy of /dev/fuse closed, so that the parent's
  // Abort() closes the last one (which is what ends the connection).
  void CloseDeviceInChild() {
    if (dev_ >= 0) ::close(dev_);
  }
  // From now on nothing is answered.
  void Stall() { stalled_.store(true); }
  // Requests that came while stalled (none answered).
  int unanswered() const { return unanswered_.load(); }
  void Abort() {
    stop_.store(true);
    if (daemon_.joinable()) daemon_.join();
    if (dev_ >= 0) ::close(dev_);  // the last /dev/fuse fd: the connection aborts
    dev_ = -1;
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
    mounted_ = false;
    if (!dir_.empty()) ::rmdir(dir_.c_str());
    dir_.clear();
  }

 private:
  bool Fail(std::string* why, const char* what) {
    *why = std::string(what) + ": " + std::strerror(errno);
    return false;
  }
  static void FillAttr(uint64_t node, fuse_attr* attr) {
    std::memset(attr, 0, sizeof(*attr));
    attr->ino = node;
    attr->mode = node == FUSE_ROOT_ID ? (S_IFDIR | 0700) : (S_IFREG | 0600);
    attr->nlink = 1;
    attr->uid = geteuid();
    attr->gid = getegid();
    attr->blksize = 4096;
  }
  void Reply(uint64_t unique, int error, const void* body, size_t size) {
    std::vector<char> out(sizeof(fuse_out_header) + size);
    fuse_out_header header{static_cast<uint32_t>(out.size()), error, unique};
    std::memcpy(out.data(), &header, sizeof(header));
    if (size > 0) std::memcpy(out.data() + sizeof(header), body, size);
    (void)!::write(dev_, out.data(), out.size());
  }
  void Serve() {
    std::vector<char> buffer(1 << 20 | 1 << 16);
    while (!stop_.load()) {
      pollfd p{dev_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const ssize_t n = ::read(dev_, buffer.data(), buffer.size());
      if (n < static_cast<ssize_t>(sizeof(fuse_in_header))) continue;
      fuse_in_header in;
      std::memcpy(&in, buffer.data(), sizeof(in));
      const char* body = buffer.data() + sizeof(in);
      if (in.opcode == FUSE_FORGET || in.opcode == FUSE_BATCH_FORGET || in.opcode == FUSE_INTERRUPT)
        continue;  // never answered
      if (stalled_.load()) {
        ++unanswered_;
        continue;
      }
      switch (in.opcode) {
        case FUSE_INIT: {
          fuse_init_out out{};
          out.major = FUSE_KERNEL_VERSION;
          out.minor = FUSE_KERNEL_MINOR_VERSION;
          out.max_write = 4096;
          out.max_readahead = 4096;
          Reply(in.unique, 0, &out, sizeof(out));
          break;
        }
        case FUSE_LOOKUP: {
          if (in.nodeid != FUSE_ROOT_ID || std::strcmp(body, "f") != 0) {
            Reply(in.unique, -ENOENT, nullptr, 0);
            break;
          }
          fuse_entry_out out{};
          out.nodeid = 2;
          out.generation = 1;
          FillAttr(2, &out.attr);  // entry and attributes valid for 0 s: never cached
          Reply(in.unique, 0, &out, sizeof(out));
          break;
        }
        case FUSE_GETATTR: {
          fuse_attr_out out{};
          FillAttr(in.nodeid, &out.attr);
          Reply(in.unique, 0, &out, sizeof(out));
          break;
        }
        case FUSE_OPEN: {
          fuse_open_out out{};
          out.fh = 1;
          Reply(in.unique, 0, &out, sizeof(out));
          break;
        }
        case FUSE_FLUSH:
        case FUSE_RELEASE:
          Reply(in.unique, 0, nullptr, 0);
          break;
        default:
          Reply(in.unique, -ENOSYS, nullptr, 0);
      }
    }
  }

  std::string dir_;
  int dev_ = -1;
  bool mounted_ = false;
  std::thread daemon_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> stalled_{false};
  std::atomic<int> unanswered_{0};
};

}  // namespace vmmipc::testing
