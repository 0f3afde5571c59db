#!/usr/bin/env python3
"""Runs a command with pidfd_getfd(2) refused (EPERM), as a container's default seccomp profile
refuses it to a process without CAP_SYS_PTRACE.

  pidfd_seccomp.py [--probe] -- CMD [ARGS...]

Sets PR_SET_NO_NEW_PRIVS, installs a seccomp BPF filter that answers pidfd_getfd (syscall 438
on x86_64 and aarch64) with EPERM and allows everything else, then execs CMD: the filter stays
with CMD and every process it starts, and with nothing else (the machine's sysctls, Yama's
ptrace_scope and other processes are left alone). --probe prints one line, before and after
installing the filter, saying what pidfd_getfd on the process's own fd 0 answers.

As a module: deny_pidfd_getfd() installs the filter in the calling process; probe() says what
pidfd_getfd answers now ("allowed", "EPERM", "ENOSYS", ...). ctypes only: no compiler, no root.
"""
import ctypes
import errno
import os
import platform
import sys

SYS_PIDFD_OPEN = 434  # the same number on every architecture since Linux 5.3
SYS_PIDFD_GETFD = 438  # since Linux 5.6
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_AARCH64 = 0xC00000B7
# struct seccomp_data: int nr at 0, __u32 arch at 4.
BPF_LD_W_ABS = 0x20
BPF_JEQ_K = 0x15
BPF_RET_K = 0x06


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                ("k", ctypes.c_uint)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


def program():
    """The filter: on x86_64 or aarch64, syscall 438 -> EPERM; everything else allowed."""
    return [
        SockFilter(BPF_LD_W_ABS, 0, 0, 4),  # 0: A = arch
        SockFilter(BPF_JEQ_K, 1, 0, AUDIT_ARCH_X86_64),  # 1: x86_64 -> 3
        SockFilter(BPF_JEQ_K, 0, 3, AUDIT_ARCH_AARCH64),  # 2: aarch64 -> 3, else -> 6
        SockFilter(BPF_LD_W_ABS, 0, 0, 0),  # 3: A = nr
        SockFilter(BPF_JEQ_K, 0, 1, SYS_PIDFD_GETFD),  # 4: pidfd_getfd -> 5, else -> 6
        SockFilter(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM),  # 5
        SockFilter(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),  # 6
    ]


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def deny_pidfd_getfd():
    """Installs the filter in this process (and what it execs or forks later). Raises OSError."""
    if platform.machine() not in ("x86_64", "aarch64"):
        raise OSError(errno.ENOTSUP, "pidfd_seccomp: x86_64 and aarch64 only, not %s"
                      % platform.machine())
    libc = _libc()
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                           ctypes.c_ulong]
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, "prctl(PR_SET_NO_NEW_PRIVS): " + os.strerror(err))
    filters = program()
    array = (SockFilter * len(filters))(*filters)
    prog = SockFprog(len(filters), ctypes.cast(array, ctypes.POINTER(SockFilter)))
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, "prctl(PR_SET_SECCOMP): " + os.strerror(err))


def probe():
    """What pidfd_getfd(pidfd_open(self), 0) answers: "allowed" or the errno's name."""
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    pidfd = libc.syscall(ctypes.c_long(SYS_PIDFD_OPEN), ctypes.c_long(os.getpid()),
                         ctypes.c_long(0))
    if pidfd < 0:
        return "pidfd_open " + errno.errorcode.get(ctypes.get_errno(), "?")
    try:
        fd = libc.syscall(ctypes.c_long(SYS_PIDFD_GETFD), ctypes.c_long(pidfd), ctypes.c_long(0),
                          ctypes.c_long(0))
        if fd < 0:
            return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
        os.close(fd)
        return "allowed"
    finally:
        os.close(pidfd)


def main(argv):
    show = "--probe" in argv[: argv.index("--")] if "--" in argv else "--probe" in argv
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        print("usage: pidfd_seccomp.py [--probe] -- CMD [ARGS...]", file=sys.stderr)
        return 2
    command = argv[argv.index("--") + 1:]
    if show:
        print("pidfd_seccomp: pid %d before the filter: pidfd_getfd %s" % (os.getpid(), probe()),
              flush=True)
    try:
        deny_pidfd_getfd()
    except OSError as exc:
        print("pidfd_seccomp: cannot install the filter: %s" % exc, file=sys.stderr)
        return 1
    if show:
        print("pidfd_seccomp: pid %d with the filter: pidfd_getfd %s" % (os.getpid(), probe()),
              flush=True)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print("pidfd_seccomp: cannot run %s: %s" % (command[0], exc), file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
