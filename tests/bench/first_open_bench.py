#!/usr/bin/env python3
"""The first open of a fresh PyTorch process pair: vmmipc beside legacy IPC, in the same run.

A benchmark (issue 24, item 5), for the GPU machine. Each round starts two fresh processes that
import torch and initialise CUDA (so they have the threads a framework has): an exporter that
makes one 2 MiB buffer and its IPC handle, and an importer that times its very first
cuIpcOpenMemHandle. Two kinds, alternated round by round: "legacy" (cuMemAlloc memory, the
driver's own IPC) and "vmmipc" (a 2 MiB cuMemCreate chunk, shared through the preloaded
libvmmipc.so: the exporter's first share, its warm-up included, and the importer's first
import). Both preloaded with vmmipc, so the preload's own start-up is the same on both sides.
Prints every round, then the medians and the ratio, and the targets: vmmipc's first open at
most 1 ms and at most 3x legacy's first open.

Run: LD_PRELOAD=/path/to/libvmmipc.so python3 tests/bench/first_open_bench.py [--rounds 7]
Exit 0 when every round ran (whatever it measured), 1 when one failed, 77 when nothing could
run here (no torch or cuda.bindings, no GPU, no libvmmipc.so in LD_PRELOAD).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SKIP = 77
CHUNK = 2 << 20
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def say(obj):
    print("REPLY " + json.dumps(obj), flush=True)


def child(role, kind):
    import torch  # pylint: disable=import-outside-toplevel
    from driver_calls import (  # pylint: disable=import-outside-toplevel
        access_desc, drv, ipc_handle_bytes, ok, vmm_prop)
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # the primary context, as a framework has it
    if role == "exporter":
        if kind == "legacy":
            ptr = ok(drv.cuMemAlloc(CHUNK), "cuMemAlloc")
        else:
            ptr = ok(drv.cuMemAddressReserve(CHUNK, 0, 0, 0), "cuMemAddressReserve")
            handle = ok(drv.cuMemCreate(CHUNK, vmm_prop(0), 0), "cuMemCreate")
            ok(drv.cuMemMap(ptr, CHUNK, 0, handle, 0), "cuMemMap")
            ok(drv.cuMemSetAccess(ptr, CHUNK, [access_desc(0)], 1), "cuMemSetAccess")
        ipc = ok(drv.cuIpcGetMemHandle(ptr), "cuIpcGetMemHandle")
        say({"handle": ipc_handle_bytes(ipc).hex()})
        sys.stdin.readline()  # the importer is done
        return 0
    raw = bytes.fromhex(sys.stdin.readline().strip())
    handle = drv.CUipcMemHandle()
    handle.reserved = raw
    lazy = drv.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
    start = time.perf_counter()
    ptr = ok(drv.cuIpcOpenMemHandle(handle, lazy), "cuIpcOpenMemHandle")
    micros = (time.perf_counter() - start) * 1e6
    ok(drv.cuIpcCloseMemHandle(ptr), "cuIpcCloseMemHandle")
    say({"first_open_us": micros})
    return 0


def start(role, kind, env):
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", role, "--kind",
                             kind], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=env)


def reply(proc):
    for line in proc.stdout:
        if line.startswith("REPLY "):
            return json.loads(line[6:])
    raise RuntimeError(f"a child ended: {proc.wait()}")


def round_trip(kind, env):
    exporter = start("exporter", kind, dict(env, VMMIPC_RANK="0"))
    importer = start("importer", kind, dict(env, VMMIPC_RANK="1"))
    try:
        handle = reply(exporter)["handle"]
        importer.stdin.write(handle + "\n")
        importer.stdin.flush()
        micros = reply(importer)["first_open_us"]
        exporter.stdin.write("done\n")
        exporter.stdin.flush()
        if importer.wait(60) != 0 or exporter.wait(60) != 0:
            raise RuntimeError("a child failed")
        return micros
    finally:
        for proc in (exporter, importer):
            if proc.poll() is None:
                proc.kill()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--role", choices=("exporter", "importer"))
    parser.add_argument("--kind", choices=("legacy", "vmmipc"), default="vmmipc")
    opts = parser.parse_args()
    if opts.role:
        return child(opts.role, opts.kind)
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
    times = {"legacy": [], "vmmipc": []}
    try:
        for i in range(opts.rounds):
            for kind in (("legacy", "vmmipc") if i % 2 == 0 else ("vmmipc", "legacy")):
                times[kind].append(round_trip(kind, env))
                print(f"ROUND {i} {kind} first open {times[kind][-1]:.1f} us", flush=True)
    except Exception as exc:  # pylint: disable=broad-except
        print(f"FAIL: {exc}", flush=True)
        return 1
    legacy = statistics.median(times["legacy"])
    vmm = statistics.median(times["vmmipc"])
    print(f"MEASURE first_open_us legacy median {legacy:.1f} (min {min(times['legacy']):.1f}, "
          f"max {max(times['legacy']):.1f}); vmmipc median {vmm:.1f} (min "
          f"{min(times['vmmipc']):.1f}, max {max(times['vmmipc']):.1f}); ratio {vmm / legacy:.2f}x; "
          f"{opts.rounds} rounds each, alternated")
    print(f"TARGET first open <= 1000 us: {'met' if vmm <= 1000 else 'MISSED'} ({vmm:.1f} us)")
    print(f"TARGET first open <= 3x legacy: {'met' if vmm <= 3 * legacy else 'MISSED'} "
          f"({vmm / legacy:.2f}x)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
