"""What kind of file the driver's exported POSIX fd of a VMM allocation is (no vmmipc): its
fstat type and mode, /proc link and fdinfo, and whether the importer's kind check
(transport/client/peer_fds.cc: regular file, non-terminal character device or anonymous inode)
takes it. Run on the GPU machine: python3 tests/bench/exported_fd_kind.py. Exit 77: no GPU."""

import os
import stat
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    from cuda.bindings import driver as drv

    import driver_calls as dc
except ImportError as e:  # no cuda.bindings here
    print(f"SKIP: {e}")
    sys.exit(77)


def main():
    try:
        dc.primary_context(0)
    except RuntimeError as e:
        print(f"SKIP: {e}")
        return 77
    prop = dc.vmm_prop(0)
    size = 2 << 20
    handle = dc.ok(drv.cuMemCreate(size, prop, 0), "cuMemCreate")
    fd = dc.ok(drv.cuMemExportToShareableHandle(handle, dc.FD_TYPE, 0),
               "cuMemExportToShareableHandle")
    st = os.fstat(fd)
    kind = stat.S_IFMT(st.st_mode)
    names = {stat.S_IFREG: "regular", stat.S_IFCHR: "char device", 0: "anonymous inode",
             stat.S_IFSOCK: "socket", stat.S_IFIFO: "fifo", stat.S_IFDIR: "directory",
             stat.S_IFBLK: "block device"}
    link = os.readlink(f"/proc/self/fd/{fd}")
    with open(f"/proc/self/fdinfo/{fd}") as f:
        fdinfo = " ".join(f.read().split())
    taken = kind in (stat.S_IFREG, 0) or (kind == stat.S_IFCHR and not os.isatty(fd))
    print(f"exported fd: type {names.get(kind, oct(kind))} (mode {oct(st.st_mode)}), "
          f"rdev {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}, link {link}, fdinfo: {fdinfo}")
    print(f"the importer's kind check {'TAKES' if taken else 'REFUSES'} it")
    os.close(fd)
    dc.ok(drv.cuMemRelease(handle), "cuMemRelease")
    return 0 if taken else 1


if __name__ == "__main__":
    sys.exit(main())
