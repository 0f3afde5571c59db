#!/usr/bin/env python3
"""The first open of a fresh PyTorch process pair: vmmipc beside legacy IPC and the driver's floor.

A benchmark (issue 24, item 5), for the GPU machine. Each round starts two fresh processes that
import torch and initialise CUDA (so they have the threads a framework has): an exporter that
makes one 2 MiB buffer and shares it, and an importer that times its very first open of it.
Three kinds, in the same run, their order rotated round by round:

  legacy   cuMemAlloc memory, the driver's own IPC: cuIpcOpenMemHandle
  vmmipc   a 2 MiB cuMemCreate chunk, shared through the preloaded libvmmipc.so: the exporter's
           first share, its warm-up included, and the importer's first cuIpcOpenMemHandle
  floor    the same chunk without vmmipc (LD_PRELOAD stripped of it on both sides): the
           exporter exports its POSIX fd (cuMemExportToShareableHandle) before the importer
           asks; the importer asks over a Unix socket (SOCK_SEQPACKET, one byte) and gets the
           fd back (socket.send_fds / recv_fds), timed on its own, and only then starts the
           timer of what vmmipc's open does with the fd in hand: cuMemImportFromShareableHandle,
           cuMemAddressReserve, cuMemMap, cuMemRelease, cuMemSetAccess. The floor of a first
           open is the fd pass plus those calls (what any fd-passing open must do at least).

legacy and vmmipc are both preloaded with vmmipc, so the preload's own start-up is the same on
both sides. Per-call times of the floor include the Python binding's own call cost (a few us a
call, five calls), so vmmipc / floor is a slight underestimate.
Prints every round, then the medians, the ratios vmmipc / floor and vmmipc / legacy, and the
targets: vmmipc's first open at most 1 ms and at most 3x legacy's first open.

Run: LD_PRELOAD=/path/to/libvmmipc.so python3 tests/bench/first_open_bench.py [--rounds 7]
Exit 0 when every round ran (whatever it measured), 1 when one failed, 77 when nothing could
run here (no torch or cuda.bindings, no GPU, no libvmmipc.so in LD_PRELOAD), with a SKIP line.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

SKIP = 77
CHUNK = 2 << 20
KINDS = ("legacy", "vmmipc", "floor")
# The floor's calls after the fd is in hand, in order: vmmipc's open with it (core/import/vmm_calls.cc).
FLOOR_CALLS = ("import", "reserve", "map", "release", "access")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def say(obj):
    print("REPLY " + json.dumps(obj), flush=True)


def floor_open(sock):
    """The importer's side of the floor: the fd over `sock`, timed apart and before the timer of
    the calls vmmipc's open makes with it (one timer over the five, and each call's own)."""
    from driver_calls import (  # pylint: disable=import-outside-toplevel
        FD_TYPE, access_desc, drv, ok)
    desc = access_desc(0)
    asked = time.perf_counter()
    sock.send(b"?")
    _, fds, _, _ = socket.recv_fds(sock, 1, 1)
    passed = time.perf_counter()
    if len(fds) != 1:
        raise RuntimeError(f"the exporter sent {len(fds)} fds, not 1")
    marks = [time.perf_counter()]
    handle = ok(drv.cuMemImportFromShareableHandle(fds[0], FD_TYPE),
                "cuMemImportFromShareableHandle")
    marks.append(time.perf_counter())
    ptr = ok(drv.cuMemAddressReserve(CHUNK, 0, 0, 0), "cuMemAddressReserve")
    marks.append(time.perf_counter())
    ok(drv.cuMemMap(ptr, CHUNK, 0, handle, 0), "cuMemMap")
    marks.append(time.perf_counter())
    ok(drv.cuMemRelease(handle), "cuMemRelease")  # the mapping keeps the memory
    marks.append(time.perf_counter())
    ok(drv.cuMemSetAccess(ptr, CHUNK, [desc], 1), "cuMemSetAccess")
    marks.append(time.perf_counter())
    os.close(fds[0])  # the driver does not take it
    ok(drv.cuMemUnmap(ptr, CHUNK), "cuMemUnmap")
    ok(drv.cuMemAddressFree(ptr, CHUNK), "cuMemAddressFree")
    calls = {name: (marks[i + 1] - marks[i]) * 1e6 for i, name in enumerate(FLOOR_CALLS)}
    return {"first_open_us": (marks[-1] - marks[0]) * 1e6, "fd_pass_us": (passed - asked) * 1e6,
            "calls_us": calls}


def child(role, kind, sock_fd):
    import torch  # pylint: disable=import-outside-toplevel
    from driver_calls import (  # pylint: disable=import-outside-toplevel
        FD_TYPE, access_desc, drv, ipc_handle_bytes, ok, vmm_prop)
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # the primary context, as a framework has it
    sock = socket.socket(fileno=sock_fd) if sock_fd is not None else None
    if role == "exporter":
        if kind == "legacy":
            ptr = ok(drv.cuMemAlloc(CHUNK), "cuMemAlloc")
        else:
            ptr = ok(drv.cuMemAddressReserve(CHUNK, 0, 0, 0), "cuMemAddressReserve")
            handle = ok(drv.cuMemCreate(CHUNK, vmm_prop(0), 0), "cuMemCreate")
            ok(drv.cuMemMap(ptr, CHUNK, 0, handle, 0), "cuMemMap")
            ok(drv.cuMemSetAccess(ptr, CHUNK, [access_desc(0)], 1), "cuMemSetAccess")
        if kind == "floor":
            fd = int(ok(drv.cuMemExportToShareableHandle(handle, FD_TYPE, 0),
                        "cuMemExportToShareableHandle"))
            say({"handle": ""})
            sock.recv(1)  # the importer asks
            socket.send_fds(sock, [b"f"], [fd])
        else:
            ipc = ok(drv.cuIpcGetMemHandle(ptr), "cuIpcGetMemHandle")
            say({"handle": ipc_handle_bytes(ipc).hex()})
        sys.stdin.readline()  # the importer is done
        return 0
    raw = bytes.fromhex(sys.stdin.readline().strip())
    if kind == "floor":
        say(floor_open(sock))
        return 0
    handle = drv.CUipcMemHandle()
    handle.reserved = raw
    lazy = drv.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
    start = time.perf_counter()
    ptr = ok(drv.cuIpcOpenMemHandle(handle, lazy), "cuIpcOpenMemHandle")
    micros = (time.perf_counter() - start) * 1e6
    ok(drv.cuIpcCloseMemHandle(ptr), "cuIpcCloseMemHandle")
    say({"first_open_us": micros})
    return 0


def without_vmmipc(env):
    """`env` with libvmmipc.so taken out of LD_PRELOAD (the floor's processes)."""
    kept = [lib for lib in env.get("LD_PRELOAD", "").replace(" ", ":").split(":")
            if lib and "libvmmipc" not in lib]
    env = dict(env)
    if kept:
        env["LD_PRELOAD"] = ":".join(kept)
    else:
        env.pop("LD_PRELOAD", None)
    return env


def start(role, kind, env, sock=None):
    args = [sys.executable, os.path.abspath(__file__), "--role", role, "--kind", kind]
    passed = ()
    if sock is not None:
        args += ["--sock", str(sock.fileno())]
        passed = (sock.fileno(),)
    return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=env, pass_fds=passed)


def reply(proc):
    for line in proc.stdout:
        if line.startswith("REPLY "):
            return json.loads(line[6:])
    raise RuntimeError(f"a child ended: {proc.wait()}")


def round_trip(kind, env):
    """One fresh pair of `kind`: the importer's reply (first_open_us; for the floor also
    fd_pass_us and calls_us)."""
    socks = (None, None)
    if kind == "floor":
        env = without_vmmipc(env)
        socks = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    exporter = start("exporter", kind, dict(env, VMMIPC_RANK="0"), socks[0])
    importer = start("importer", kind, dict(env, VMMIPC_RANK="1"), socks[1])
    for sock in socks:
        if sock is not None:
            sock.close()  # the children have theirs
    try:
        handle = reply(exporter)["handle"]
        importer.stdin.write(handle + "\n")
        importer.stdin.flush()
        answer = reply(importer)
        exporter.stdin.write("done\n")
        exporter.stdin.flush()
        if importer.wait(60) != 0 or exporter.wait(60) != 0:
            raise RuntimeError("a child failed")
        return answer
    finally:
        for proc in (exporter, importer):
            if proc.poll() is None:
                proc.kill()


def spread(values):
    return (f"median {statistics.median(values):.1f} (min {min(values):.1f}, "
            f"max {max(values):.1f})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--role", choices=("exporter", "importer"))
    parser.add_argument("--kind", choices=KINDS, default="vmmipc")
    parser.add_argument("--sock", type=int, help="(the floor's children) their socket's fd")
    opts = parser.parse_args()
    if opts.role:
        return child(opts.role, opts.kind, opts.sock)
    try:
        import torch  # pylint: disable=import-outside-toplevel
        from cuda.bindings import driver  # pylint: disable=import-outside-toplevel,unused-import
        if not torch.cuda.is_available():
            raise ImportError("no GPU")
    except ImportError as exc:
        print(f"SKIP: {exc}")
        return SKIP
    if "libvmmipc" not in os.environ.get("LD_PRELOAD", ""):
        print("SKIP: libvmmipc.so is not in LD_PRELOAD")
        return SKIP
    env = dict(os.environ)
    times = {kind: [] for kind in KINDS}
    fd_pass, floor_total = [], []
    calls = {name: [] for name in FLOOR_CALLS}
    try:
        for i in range(opts.rounds):
            for kind in KINDS[i % 3:] + KINDS[:i % 3]:
                answer = round_trip(kind, env)
                times[kind].append(answer["first_open_us"])
                line = f"ROUND {i} {kind} first open {times[kind][-1]:.1f} us"
                if kind == "floor":
                    fd_pass.append(answer["fd_pass_us"])
                    floor_total.append(fd_pass[-1] + times[kind][-1])
                    for name in FLOOR_CALLS:
                        calls[name].append(answer["calls_us"][name])
                    line = (f"ROUND {i} floor {floor_total[-1]:.1f} us: fd pass {fd_pass[-1]:.1f} "
                            f"us, then the calls {times[kind][-1]:.1f} us (" +
                            ", ".join(f"{name} {calls[name][-1]:.1f}" for name in FLOOR_CALLS) +
                            ")")
                print(line, flush=True)
    except Exception as exc:  # pylint: disable=broad-except
        print(f"FAIL: {exc}", flush=True)
        return 1
    legacy = statistics.median(times["legacy"])
    vmm = statistics.median(times["vmmipc"])
    floor = statistics.median(floor_total)
    floor_calls = statistics.median(times["floor"])
    print(f"MEASURE first_open_us legacy {spread(times['legacy'])}; vmmipc "
          f"{spread(times['vmmipc'])}; floor {spread(floor_total)}; {opts.rounds} rounds each, "
          f"order rotated")
    print(f"MEASURE floor parts: fd pass {spread(fd_pass)} (timed before the calls' timer "
          f"starts); the calls {spread(times['floor'])}: " +
          ", ".join(f"{name} {statistics.median(calls[name]):.1f}" for name in FLOOR_CALLS) +
          " (medians, us)")
    print(f"RATIO vmmipc / floor {vmm / floor:.2f}x (against the calls alone "
          f"{vmm / floor_calls:.2f}x); vmmipc / legacy {vmm / legacy:.2f}x; legacy / floor "
          f"{legacy / floor:.2f}x")
    print(f"TARGET first open <= 1000 us: {'met' if vmm <= 1000 else 'MISSED'} ({vmm:.1f} us)")
    print(f"TARGET first open <= 3x legacy: {'met' if vmm <= 3 * legacy else 'MISSED'} "
          f"({vmm / legacy:.2f}x)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
