#!/usr/bin/env python3
"""Which variant of the importer's driver sequence costs what, without vmmipc.

One exporter and one importer process on one GPU, no socket on the clock: every fd is
received before timing starts. The importer times, per open, the driver calls that vmmipc's
open makes after its fetch (import, map, set access), in variants that differ in one thing
each, interleaved round-robin so that the machine's drift hits them alike. A variant names:

  the chunk     kept: the same allocation every time (exported once, as a kept fd);
                fresh: an allocation never imported before (one per open)
  the range     the reservation it is mapped into (its size; driver-chosen or at a fixed
                address) and the offset in it; every reservation is made once, before timing
  the order     release after unmap (untimed), or between map and set access (vmmipc's order)

The default set compares the floor (a 2 MiB range of its own) with vmmipc's import zone
(8 slots x 1 TiB at 0x300000000000) and with reservations in between, to find what makes
set access dearer. `legacy` (cuIpcOpenMemHandle of a cuMemAlloc buffer) is there for scale.
Every mapping is unmapped after the open, untimed; a fresh chunk's received fd is closed
after its import, timed apart (fd_close).

  open_sequence_probe.py [--iters 100] [--chunk-mib 2] [--variants a,b,...]

Prints a table of medians and p90 per phase and variant. Exit 0 when every call worked.
"""

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time

from cuda.bindings import driver as drv

from driver_calls import FD_TYPE, access_desc, ok, primary_context, vmm_prop

GiB = 1 << 30
TiB = 1 << 40
ZONE = 0x300000000000
# name: (chunk, reservation size, fixed address or 0, offset of the mapping, release first,
#        offset of an anchor from the mapping or None). An anchor is a 2 MiB chunk of the
#        importer's own, mapped there for the whole run (page tables the open then shares).
VARIANTS = {
    "floor": ("kept", 2 << 20, 0, 0, False, None),
    "release_first": ("kept", 2 << 20, 0, 0, True, None),
    "fresh": ("fresh", 2 << 20, 0, 0, False, None),
    "r1g": ("kept", GiB, 0, 256 << 20, False, None),
    "r64g": ("kept", 64 * GiB, 0, 33 * GiB, False, None),
    "r1t": ("kept", TiB, 0, 256 << 20, False, None),
    "r1t_fixed": ("kept", TiB, 0x500000000000, 256 << 20, False, None),
    "r8t_auto": ("kept", 8 * TiB, 0, TiB + (256 << 20), False, None),
    "zone": ("kept", 8 * TiB, ZONE, TiB + (256 << 20), True, None),
    "zone_start": ("kept", 8 * TiB, ZONE, 0, False, None),
    "fresh_zone": ("fresh", 8 * TiB, ZONE, TiB + (256 << 20), True, None),
    "zone_anchor_2m": ("kept", 8 * TiB, ZONE, 2 * TiB + (256 << 20), True, 2 << 20),
    "zone_anchor_64m": ("kept", 8 * TiB, ZONE, 3 * TiB + (256 << 20), True, 64 << 20),
    "zone_anchor_254m": ("kept", 8 * TiB, ZONE, 6 * TiB + (256 << 20), True, 254 << 20),
    "zone_anchor_258m": ("kept", 8 * TiB, ZONE, 7 * TiB + (256 << 20), True, 258 << 20),
    "zone_anchor_1g": ("kept", 8 * TiB, ZONE, 4 * TiB + (256 << 20), True, GiB),
    "zone_anchor_64g": ("kept", 8 * TiB, ZONE, 5 * TiB + (256 << 20), True, 64 * GiB),
}
DEFAULT = ("floor,release_first,fresh,r1g,r64g,r1t,r1t_fixed,r8t_auto,zone,zone_start,"
           "fresh_zone,zone_anchor_2m,zone_anchor_64m,zone_anchor_254m,zone_anchor_258m,"
           "zone_anchor_1g,zone_anchor_64g")


def exporter_main(args, sock, done):
    primary_context(args.device)
    size = args.chunk_mib << 20
    prop = vmm_prop(args.device)
    count = 1 + args.fresh * args.iters  # the kept chunk, then one per fresh open
    va = ok(drv.cuMemAddressReserve(size * count, 0, 0, 0), "reserve")
    handles, fds = [], []
    for k in range(count):
        h = ok(drv.cuMemCreate(size, prop, 0), "cuMemCreate")
        ok(drv.cuMemMap(int(va) + k * size, size, 0, h, 0), "cuMemMap")
        fds.append(int(ok(drv.cuMemExportToShareableHandle(h, FD_TYPE, 0), "export")))
        handles.append(h)
    ok(drv.cuMemSetAccess(va, size * count, [access_desc(args.device)], 1), "own access")
    legacy = ok(drv.cuMemAlloc(size), "cuMemAlloc")
    sock.sendall(bytes(ok(drv.cuIpcGetMemHandle(legacy), "cuIpcGetMemHandle").reserved))
    for start in range(0, count, 200):  # SCM_RIGHTS takes at most 253 fds a message
        socket.send_fds(sock, [b"f"], fds[start:start + 200])
    done.wait()
    ok(drv.cuMemUnmap(va, size * count), "unmap")
    for h, fd in zip(handles, fds):
        ok(drv.cuMemRelease(h), "release")
        os.close(fd)
    ok(drv.cuMemAddressFree(va, size * count), "free")
    ok(drv.cuMemFree(legacy), "cuMemFree")


def importer_main(args, sock, done, results):
    primary_context(args.device)
    size = args.chunk_mib << 20
    desc = access_desc(args.device)
    raw = b""
    while len(raw) < 64:
        raw += sock.recv(64 - len(raw))
    ipc = drv.CUipcMemHandle()
    ipc.reserved = raw
    count = 1 + args.fresh * args.iters
    fds = []
    while len(fds) < count:
        _, got, _, _ = socket.recv_fds(sock, 1, 200)
        fds.extend(got)
    kept_fd, fresh = fds[0], iter(fds[1:])
    # One reservation per (size, address): variants that share one share it.
    ranges, targets, anchors = {}, {}, []
    prop = vmm_prop(args.device, exportable=False)
    for name in args.variants:
        _, reserve, fixed, offset, _, anchor = VARIANTS[name]
        if (reserve, fixed) not in ranges:
            got = int(ok(drv.cuMemAddressReserve(reserve, 0, fixed, 0), f"reserve for {name}"))
            if fixed and got != fixed:
                raise RuntimeError(f"{name}: reserved at {got:#x}, not {fixed:#x}")
            ranges[(reserve, fixed)] = got
        targets[name] = ranges[(reserve, fixed)] + offset
        if anchor is not None:
            h = ok(drv.cuMemCreate(2 << 20, prop, 0), "anchor cuMemCreate")
            ok(drv.cuMemMap(targets[name] + anchor, 2 << 20, 0, h, 0), "anchor map")
            ok(drv.cuMemSetAccess(targets[name] + anchor, 2 << 20, [desc], 1), "anchor access")
            anchors.append((targets[name] + anchor, h))
    args.targets = targets
    times = {v: {} for v in args.variants + ["legacy"]}

    def vmm_open(variant):
        chunk, _, _, _, release_first, _ = VARIANTS[variant]
        fd = kept_fd if chunk == "kept" else next(fresh)
        target = targets[variant]
        t0 = time.perf_counter()
        h = ok(drv.cuMemImportFromShareableHandle(fd, FD_TYPE), "import")
        t1 = time.perf_counter()
        if chunk == "fresh":
            os.close(fd)
        t2 = time.perf_counter()
        ok(drv.cuMemMap(target, size, 0, h, 0), "map")
        t3 = time.perf_counter()
        if release_first:
            ok(drv.cuMemRelease(h), "release")
        t4 = time.perf_counter()
        ok(drv.cuMemSetAccess(target, size, [desc], 1), "access")
        t5 = time.perf_counter()
        ok(drv.cuMemUnmap(target, size), "unmap")
        if not release_first:
            ok(drv.cuMemRelease(h), "release")
        for name, a, b in (("import", t0, t1), ("fd_close", t1, t2), ("map", t2, t3),
                           ("release", t3, t4), ("access", t4, t5), ("open", t0, t5)):
            times[variant].setdefault(name, []).append(b - a)

    for _ in range(args.iters):
        for variant in args.variants:
            vmm_open(variant)
        t0 = time.perf_counter()
        p = ok(drv.cuIpcOpenMemHandle(ipc, drv.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
               "cuIpcOpenMemHandle")
        times["legacy"].setdefault("open", []).append(time.perf_counter() - t0)
        ok(drv.cuIpcCloseMemHandle(p), "cuIpcCloseMemHandle")
    os.close(kept_fd)
    for address, h in anchors:
        ok(drv.cuMemUnmap(address, 2 << 20), "anchor unmap")
        ok(drv.cuMemRelease(h), "anchor release")
    for (reserve, _), base in ranges.items():
        ok(drv.cuMemAddressFree(base, reserve), "free")
    done.set()
    results.put((times, targets))


def describe(variant, targets):
    if variant == "legacy":
        return "cuIpcOpenMemHandle"
    chunk, reserve, fixed, offset, release_first, anchor = VARIANTS[variant]
    size = f"{reserve >> 20} MiB" if reserve < GiB else f"{reserve // GiB} GiB"
    where = f"at {fixed:#x}" if fixed else "driver's address"
    text = (f"{chunk}, {size} {where}, mapped at {targets[variant]:#x}, "
            f"{'release first' if release_first else 'release last'}")
    if anchor is not None:
        text += f", anchor mapped {anchor >> 20} MiB above"
    return text


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--chunk-mib", type=int, default=2)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--variants", default=DEFAULT,
                        help="comma-separated, of: " + ", ".join(VARIANTS))
    args = parser.parse_args()
    args.variants = args.variants.split(",")
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        sys.exit(f"unknown variants: {unknown}")
    args.fresh = sum(VARIANTS[v][0] == "fresh" for v in args.variants)
    ctx = mp.get_context("fork")  # the parent never initialises CUDA
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    done = ctx.Event()
    results = ctx.Queue()
    procs = [ctx.Process(target=exporter_main, args=(args, a, done)),
             ctx.Process(target=importer_main, args=(args, b, done, results))]
    for p in procs:
        p.start()
    times, targets = results.get(timeout=600)
    failed = 0
    for p in procs:
        p.join()
        failed += p.exitcode != 0
    phases = ("open", "import", "fd_close", "map", "release", "access")
    print(f"open_sequence_probe: {args.iters} opens per variant, {args.chunk_mib} MiB chunks, "
          f"one GPU; us: p50 / p90")
    print("| variant | chunk, range, offset, order | " + " | ".join(phases) + " |")
    print("| --- | --- |" + " --- |" * len(phases))
    for variant in args.variants + ["legacy"]:
        cells = []
        for name in phases:
            v = sorted(times[variant].get(name, []))
            cells.append(f"{statistics.median(v) * 1e6:.1f} / {v[int(len(v) * 0.9)] * 1e6:.1f}"
                         if v else "")
        print(f"| {variant} | {describe(variant, targets)} | " + " | ".join(cells) + " |")
    # The line scripts/gpu-check.sh shows: what an empty 512 MiB stretch costs set access.
    access = {v: statistics.median(times[v]["access"]) * 1e6 for v in args.variants
              if times[v].get("access")}
    if all(v in access for v in ("floor", "zone", "zone_anchor_254m")):
        print(f"SET_ACCESS p50: floor {access['floor']:.1f} us, zone (empty stretch) "
              f"{access['zone']:.1f} us, zone with an anchor in the stretch "
              f"{access['zone_anchor_254m']:.1f} us")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
