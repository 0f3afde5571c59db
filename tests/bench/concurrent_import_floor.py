#!/usr/bin/env python3
"""The driver's own floor for an all-to-all of VMM imports, beside legacy IPC, without vmmipc.

What vmmipc's all-to-all benchmark (vmmipc_all_to_all) cannot show by itself: how much of an
open's cost under concurrency is the driver's. Here N processes (one GPU or several) each
create K VMM chunks (cuMemCreate with POSIX-fd export, mapped, one export each) and K
cuMemAlloc buffers (cuIpcGetMemHandle each); every fd and handle is exchanged before the clock
starts (fds by SCM_RIGHTS over socketpairs), then all ranks are released at once and each
opens every peer's K chunks:

  legacy     cuIpcOpenMemHandle (lazy peer access), what vmmipc is compared with
  vmm        what vmmipc's open does after its socket round trip, with the fd in hand:
             cuMemImportFromShareableHandle, cuMemMap into a reserved range, cuMemRelease,
             cuMemSetAccess; each call timed apart

and, as more rounds, the same with only rank 0 opening while the others wait (alone), and
with every rank exporting its own K chunks once more on a second thread while it imports
(exporting: the pattern of vmmipc's export ahead, which runs on the exporter's listener
thread after the gets, while the peers' opens arrive).
No vmmipc: run it without LD_PRELOAD. Per-call times include the Python binding's own call
cost (a few us a call; four calls for vmm, one for legacy), so the vmm/legacy ratio here is
a slight overestimate of the driver's.

  concurrent_import_floor.py [--ranks 2] [--gpus 1] [--per-rank 64] [--chunk-mib 2] [--reps 3]

Prints one table row per (mode, round) with per-open medians and p90 over all ranks and
repetitions, and RATIO lines. Exit 0 when every open worked.
"""

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import sys
import threading
import time

from cuda.bindings import driver as drv

from driver_calls import FD_TYPE, access_desc, ok, primary_context, vmm_prop


def rank_main(rank, args, socks, barrier, results):
    device = rank % args.gpus
    ctx = primary_context(device)
    size = args.chunk_mib << 20
    prop = vmm_prop(device)
    desc = access_desc(device)
    fd_type = FD_TYPE
    out = {}
    for rep in range(args.reps):
        # Own memory: K VMM chunks (mapped, exported once) and K cuMemAlloc buffers.
        own_va = ok(drv.cuMemAddressReserve(size * args.per_rank, 0, 0, 0), "reserve")
        handles, fds, legacy, ipc = [], [], [], []
        for k in range(args.per_rank):
            h = ok(drv.cuMemCreate(size, prop, 0), "cuMemCreate")
            ok(drv.cuMemMap(int(own_va) + k * size, size, 0, h, 0), "cuMemMap")
            fds.append(int(ok(drv.cuMemExportToShareableHandle(h, fd_type, 0), "export")))
            handles.append(h)
            p = ok(drv.cuMemAlloc(size), "cuMemAlloc")
            legacy.append(p)
            ipc.append(bytes(ok(drv.cuIpcGetMemHandle(p), "cuIpcGetMemHandle").reserved))
        ok(drv.cuMemSetAccess(own_va, size * args.per_rank, [desc], 1), "own access")
        # Exchange with every peer before the clock: fds by SCM_RIGHTS, handles as bytes.
        peer_fds, peer_ipc = {}, {}
        for peer, sock in socks.items():
            sock.sendall(b"".join(ipc))
            socket.send_fds(sock, [b"f"], fds)
        for peer, sock in socks.items():
            raw = b""
            while len(raw) < 64 * args.per_rank:
                raw += sock.recv(64 * args.per_rank - len(raw))
            peer_ipc[peer] = [raw[i * 64:(i + 1) * 64] for i in range(args.per_rank)]
            _, got, _, _ = socket.recv_fds(sock, 1, args.per_rank)
            peer_fds[peer] = got
        for round_name in ("together", "alone", "exporting"):
            opening = round_name != "alone" or rank == 0
            for mode in ("legacy", "vmm"):
                exporter = None
                if round_name == "exporting" and mode == "vmm":
                    def export_again():
                        ok(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
                        for h in handles:
                            os.close(int(ok(drv.cuMemExportToShareableHandle(h, fd_type, 0),
                                            "export again")))
                    exporter = threading.Thread(target=export_again)
                barrier.wait()
                if exporter is not None:
                    exporter.start()
                times = {"open": [], "import": [], "map": [], "release": [], "access": []}
                mapped, opened = [], []
                if opening:
                    peer_va = {}
                    for peer in socks:
                        peer_va[peer] = ok(drv.cuMemAddressReserve(size * args.per_rank, 0, 0, 0),
                                           "peer reserve")
                    barrier_t0 = time.perf_counter()
                    for peer in socks:
                        for k in range(args.per_rank):
                            if mode == "legacy":
                                handle = drv.CUipcMemHandle()
                                handle.reserved = peer_ipc[peer][k]
                                t0 = time.perf_counter()
                                p = ok(drv.cuIpcOpenMemHandle(
                                    handle, drv.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                                    "cuIpcOpenMemHandle")
                                times["open"].append(time.perf_counter() - t0)
                                opened.append(p)
                                continue
                            target = int(peer_va[peer]) + k * size
                            t0 = time.perf_counter()
                            h = ok(drv.cuMemImportFromShareableHandle(peer_fds[peer][k], fd_type),
                                   "import")
                            t1 = time.perf_counter()
                            ok(drv.cuMemMap(target, size, 0, h, 0), "map")
                            t2 = time.perf_counter()
                            ok(drv.cuMemRelease(h), "release")
                            t3 = time.perf_counter()
                            ok(drv.cuMemSetAccess(target, size, [desc], 1), "access")
                            t4 = time.perf_counter()
                            for name, a, b in (("import", t0, t1), ("map", t1, t2),
                                               ("release", t2, t3), ("access", t3, t4),
                                               ("open", t0, t4)):
                                times[name].append(b - a)
                            mapped.append(target)
                    total = time.perf_counter() - barrier_t0
                    out.setdefault((mode, round_name), {"total": []})["total"].append(total)
                    for name, values in times.items():
                        if values:
                            out[(mode, round_name)].setdefault(name, []).extend(values)
                if exporter is not None:
                    exporter.join()
                barrier.wait()  # everyone done before anything is undone
                for p in opened:
                    ok(drv.cuIpcCloseMemHandle(p), "close")
                for target in mapped:
                    ok(drv.cuMemUnmap(target, size), "unmap")
                if opening:
                    for peer in socks:
                        ok(drv.cuMemAddressFree(peer_va[peer], size * args.per_rank), "free")
        for got in peer_fds.values():
            for fd in got:
                os.close(fd)
        barrier.wait()
        ok(drv.cuMemUnmap(own_va, size * args.per_rank), "own unmap")
        for h, fd in zip(handles, fds):
            ok(drv.cuMemRelease(h), "own release")
            os.close(fd)
        ok(drv.cuMemAddressFree(own_va, size * args.per_rank), "own free")
        for p in legacy:
            ok(drv.cuMemFree(p), "cuMemFree")
        barrier.wait()
    results.put((rank, {f"{m}|{r}": v for (m, r), v in out.items()}))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--per-rank", type=int, default=64)
    parser.add_argument("--chunk-mib", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    if args.ranks < 2:
        sys.exit("--ranks must be at least 2")
    ctx = mp.get_context("fork")  # the parent never initialises CUDA
    pairs = {}
    for a in range(args.ranks):
        for b in range(a + 1, args.ranks):
            pairs[(a, b)] = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    barrier = ctx.Barrier(args.ranks)
    results = ctx.Queue()
    procs = []
    for r in range(args.ranks):
        socks = {}
        for (a, b), (sa, sb) in pairs.items():
            if a == r:
                socks[b] = sa
            elif b == r:
                socks[a] = sb
        procs.append(ctx.Process(target=rank_main, args=(r, args, socks, barrier, results)))
    for p in procs:
        p.start()
    merged = {}
    for _ in procs:
        _, data = results.get(timeout=600)
        for key, phases in data.items():
            for name, values in phases.items():
                merged.setdefault(key, {}).setdefault(name, []).extend(values)
    failed = 0
    for p in procs:
        p.join()
        failed += p.exitcode != 0
    print(f"concurrent_import_floor: {args.ranks} ranks on {args.gpus} GPU(s), K={args.per_rank} x "
          f"{args.chunk_mib} MiB, {args.reps} reps; per-open us: p50 / p90 over all opens; "
          f"total ms: median over ranks x reps")
    print("| mode | round | opens | total ms | open | import | map | release | set access |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    med = {}
    for key in sorted(merged):
        phases = merged[key]
        mode, round_name = key.split("|")

        def stat(name):
            v = sorted(phases.get(name, []))
            if not v:
                return ""
            return f"{statistics.median(v) * 1e6:.1f} / {v[int(len(v) * 0.9)] * 1e6:.1f}"

        med[key] = statistics.median(phases["open"]) * 1e6
        print(f"| {mode} | {round_name} | {len(phases['open'])} | "
              f"{statistics.median(phases['total']) * 1e3:.2f} | {stat('open')} | {stat('import')} | "
              f"{stat('map')} | {stat('release')} | {stat('access')} |")
    for round_name in ("together", "alone", "exporting"):
        if f"vmm|{round_name}" in med and f"legacy|{round_name}" in med:
            print(f"RATIO {round_name}: vmm floor / legacy open p50 = "
                  f"{med[f'vmm|{round_name}'] / med[f'legacy|{round_name}']:.2f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
