#!/usr/bin/env python3
"""What one cuMemExportToShareableHandle costs, by chunk size, layout and handle, without vmmipc.

Why: vmmipc's first answer for a fresh 1 GiB buffer in 20 MiB chunks (52 chunks, one
reservation) took 21-32 ms on the H200, 0.4-0.6 ms a chunk, while the benchmark's floor
exporter exported the same layout at ~35 us a chunk. This probe varies one thing at a time.
One process, one GPU; an anchor (one exported fd of another allocation) stays open throughout,
so the driver's export state is set up before any timing. Per variant, `--chunks` fresh chunks
are created and mapped untimed, then exported one by one (timed), the fds kept until the
variant ends; their close is timed too. A variant names:

  size        2m or 20m: the chunk size
  layout      own: a reservation per chunk; run: every chunk in one reservation, contiguous
  handle      created: the cuMemCreate handle; retained: cuMemRetainAllocationHandle on the
              chunk's address, export, cuMemRelease of it (what vmmipc does), each timed
  touched     the chunks written (cuMemsetD8) before the exports, or not

Variants run round-robin, `--rounds` times. Prints p50 / max of the export (and of retain and
release where used) per variant, the first export of each round, and every export over 1 ms
with the number of exported fds the process held at that moment.

  export_cost_probe.py [--chunks 52] [--rounds 3] [--variants a,b,...]

Exit 0 when every call worked.
"""

import argparse
import os
import statistics
import sys
import time

from cuda.bindings import driver as drv

from driver_calls import FD_TYPE, access_desc, ok, primary_context, vmm_prop

MiB = 1 << 20
# name: (chunk bytes, one reservation for the run, retained handle, touched)
VARIANTS = {
    "own_2m": (2 * MiB, False, False, False),
    "own_20m": (20 * MiB, False, False, False),
    "run_20m": (20 * MiB, True, False, False),
    "run_20m_retained": (20 * MiB, True, True, False),
    "run_20m_retained_touched": (20 * MiB, True, True, True),
    "own_20m_retained": (20 * MiB, False, True, False),
    "run_2m_retained": (2 * MiB, True, True, False),
}


def us_since(t0):
    return (time.perf_counter_ns() - t0) / 1e3


SLOW_US = 1000.0


def run_variant(name, chunks, device, live_before, slow):
    size, one_run, retained, touched = VARIANTS[name]
    prop = vmm_prop(device)
    access = access_desc(device)
    handles, ranges, mapped = [], [], []
    if one_run:
        base = ok(drv.cuMemAddressReserve(size * chunks, 0, 0, 0), "cuMemAddressReserve")
        ranges.append((base, size * chunks))
    for i in range(chunks):
        h = ok(drv.cuMemCreate(size, prop, 0), "cuMemCreate")
        handles.append(h)
        if one_run:
            va = int(ranges[0][0]) + i * size
        else:
            va = int(ok(drv.cuMemAddressReserve(size, 0, 0, 0), "cuMemAddressReserve"))
            ranges.append((va, size))
        ok(drv.cuMemMap(va, size, 0, h, 0), "cuMemMap")
        ok(drv.cuMemSetAccess(va, size, [access], 1), "cuMemSetAccess")
        mapped.append(va)
    if touched:
        for va in mapped:
            ok(drv.cuMemsetD8(va, 7, size), "cuMemsetD8")
        ok(drv.cuCtxSynchronize(), "cuCtxSynchronize")
    times = {"export": [], "retain": [], "release": [], "close": []}
    fds = []
    for i, va in enumerate(mapped):
        h = handles[i]
        if retained:
            t0 = time.perf_counter_ns()
            h = ok(drv.cuMemRetainAllocationHandle(va), "cuMemRetainAllocationHandle")
            times["retain"].append(us_since(t0))
        t0 = time.perf_counter_ns()
        fd = ok(drv.cuMemExportToShareableHandle(h, FD_TYPE, 0), "cuMemExportToShareableHandle")
        times["export"].append(us_since(t0))
        if times["export"][-1] > SLOW_US:
            slow.append((name, i, live_before + len(fds), times["export"][-1]))
        fds.append(int(fd))
        if retained:
            t0 = time.perf_counter_ns()
            ok(drv.cuMemRelease(h), "cuMemRelease (retained)")
            times["release"].append(us_since(t0))
    for fd in fds:
        t0 = time.perf_counter_ns()
        os.close(fd)
        times["close"].append(us_since(t0))
    for i, va in enumerate(mapped):
        ok(drv.cuMemUnmap(va, size), "cuMemUnmap")
        ok(drv.cuMemRelease(handles[i]), "cuMemRelease")
    for base, length in ranges:
        ok(drv.cuMemAddressFree(base, length), "cuMemAddressFree")
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=52)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        print(f"export_cost_probe: unknown variants {unknown}; known: {list(VARIANTS)}")
        return 2
    primary_context(args.device)
    # The anchor: one exported fd alive throughout, so no export below pays the set-up.
    anchor = ok(drv.cuMemCreate(2 * MiB, vmm_prop(args.device), 0), "cuMemCreate (anchor)")
    anchor_fd = ok(drv.cuMemExportToShareableHandle(anchor, FD_TYPE, 0), "export (anchor)")
    results = {v: {"export": [], "retain": [], "release": [], "close": [], "first": []}
               for v in names}
    slow = []
    for _ in range(args.rounds):
        for v in names:
            t = run_variant(v, args.chunks, args.device, 1, slow)
            for k in ("export", "retain", "release", "close"):
                results[v][k] += t[k]
            results[v]["first"].append(t["export"][0])
    print(f"export cost, {args.chunks} chunks a variant, {args.rounds} rounds; p50 / max in us")
    print("| variant | export | first export of a round | retain | release | close of its fd |")
    print("| --- | --- | --- | --- | --- | --- |")

    def cell(xs):
        return f"{statistics.median(xs):.1f} / {max(xs):.1f}" if xs else ""

    for v in names:
        r = results[v]
        firsts = ", ".join(f"{x:.0f}" for x in r["first"])
        print(f"| {v} | {cell(r['export'])} | {firsts} | {cell(r['retain'])} | "
              f"{cell(r['release'])} | {cell(r['close'])} |")
    for v, i, live, us in slow:
        print(f"export over {SLOW_US:.0f} us: {v}, chunk {i}, {live} exported fds held: {us:.0f} us")
    os.close(int(anchor_fd))
    ok(drv.cuMemRelease(anchor), "cuMemRelease (anchor)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
