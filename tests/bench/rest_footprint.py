#!/usr/bin/env python3
"""What each rank holds at rest after an all-to-all registration: fds and threads, by setting.

N ranks on one GPU (--ranks, default 8), each a fresh process with libvmmipc.so preloaded and
PyTorch's expandable segments (VMM memory): each allocates one tensor (--mib, default 64),
hands out its handle (cudaIpcGetMemHandle through CuPy), waits for every peer's, opens all of
them (cudaIpcOpenMemHandle), reads a byte of each, then counts its own fds (/proc/self/fd) and
threads (/proc/self/task) once two counts 50 ms apart agree (at most 5 s). Lanes, alternated
round by round, each a fresh set of processes:
  default   no VMMIPC_* setting (follow on, since issue 43)
  nofollow  VMMIPC_FOLLOW=0 (vmmipc's default before issue 43)
  torch     no vmmipc at all, no sharing: what torch and CuPy alone hold (the floor)
Prints each rank's counts, then per lane the medians over ranks and rounds and the default's
difference from nofollow (what follow costs an importer of N - 1 exporters).

  rest_footprint.py --lib build/csrc/libvmmipc.so [--ranks 8] [--rounds 2] [--mib 64]
Exit 77 without torch, CuPy or a GPU; 1 when a rank failed; else 0.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SKIP = 77


def count(path):
    return len(os.listdir(path))


def rank_main(rank, ranks, folder, mib, share):
    import cupy  # pylint: disable=import-outside-toplevel
    import torch  # pylint: disable=import-outside-toplevel
    torch.cuda.set_device(0)
    tensor = torch.full((mib << 20,), rank + 1, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    opened = []
    if share:
        handle = bytes(cupy.cuda.runtime.ipcGetMemHandle(tensor.data_ptr())).hex()
        with open(os.path.join(folder, f"h{rank}.tmp"), "w", encoding="utf-8") as out:
            out.write(handle)
        os.rename(os.path.join(folder, f"h{rank}.tmp"), os.path.join(folder, f"h{rank}"))
        deadline = time.monotonic() + 120
        peers = {}
        while len(peers) < ranks - 1 and time.monotonic() < deadline:
            for peer in range(ranks):
                path = os.path.join(folder, f"h{peer}")
                if peer != rank and peer not in peers and os.path.exists(path):
                    with open(path, encoding="utf-8") as text:
                        peers[peer] = text.read()
            time.sleep(0.01)
        for peer, text in sorted(peers.items()):
            ptr = cupy.cuda.runtime.ipcOpenMemHandle(bytes.fromhex(text))
            opened.append(ptr)
            memory = cupy.cuda.UnownedMemory(ptr, 1, None)
            value = cupy.ndarray((1,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(memory, 0))
            if int(value[0]) != peer + 1:
                print(json.dumps({"rank": rank, "error": f"peer {peer} reads {int(value[0])}"}))
                return 1
        if len(opened) != ranks - 1:
            print(json.dumps({"rank": rank, "error": f"{len(opened)} peers of {ranks - 1}"}))
            return 1
    # At rest: two counts 50 ms apart agree.
    last = None
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        now = (count("/proc/self/fd"), count("/proc/self/task"))
        if now == last:
            break
        last = now
        time.sleep(0.05)
    with open(os.path.join(folder, f"done{rank}"), "w", encoding="utf-8"):
        pass
    # Stay until every rank counted: an exiting peer would change the counts.
    while sum(os.path.exists(os.path.join(folder, f"done{p}")) for p in range(ranks)) < ranks:
        time.sleep(0.01)
    print(json.dumps({"rank": rank, "fds": last[0], "threads": last[1], "peers": len(opened)}))
    for ptr in opened:
        cupy.cuda.runtime.ipcCloseMemHandle(ptr)
    return 0


def run_lane(lane, opts, lib, rows):
    folder = tempfile.mkdtemp(prefix=f"rest-{lane}-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VMMIPC_")}
    env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    env.pop("LD_PRELOAD", None)
    if lane != "torch":
        env["LD_PRELOAD"] = lib
    if lane == "nofollow":
        env["VMMIPC_FOLLOW"] = "0"
    procs = []
    for rank in range(opts.ranks):
        child = dict(env, VMMIPC_RANK=str(rank))
        procs.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--rank", str(rank), "--ranks",
             str(opts.ranks), "--folder", folder, "--mib", str(opts.mib),
             "--share", "0" if lane == "torch" else "1"],
            env=child, stdout=subprocess.PIPE, text=True))
    failed = False
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        for line in out.splitlines():
            if not line.startswith("{"):
                continue
            row = json.loads(line)
            row["lane"] = lane
            rows.append(row)
            print(f"RANK {lane} {json.dumps(row)}", flush=True)
            failed = failed or "error" in row
        failed = failed or proc.returncode != 0
    return failed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lib", default="build/csrc/libvmmipc.so")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--lanes", default="default,nofollow,torch")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--share", type=int, default=1, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.rank is not None:
        return rank_main(opts.rank, opts.ranks, opts.folder, opts.mib, opts.share == 1)
    try:
        import cupy  # noqa: F401 pylint: disable=import-outside-toplevel,unused-import
        import torch  # pylint: disable=import-outside-toplevel
        if not torch.cuda.is_available():
            raise ImportError("no GPU")
    except ImportError as exc:
        print(f"SKIP: {exc}")
        return SKIP
    lib = os.path.abspath(opts.lib)
    rows, failed = [], False
    lanes = opts.lanes.split(",")
    for round_index in range(opts.rounds):
        for lane in lanes if round_index % 2 == 0 else reversed(lanes):
            failed = run_lane(lane, opts, lib, rows) or failed
    medians = {}
    for lane in lanes:
        good = [r for r in rows if r["lane"] == lane and "error" not in r]
        if not good:
            print(f"LANE {lane}: no rank counted")
            continue
        fds = statistics.median(r["fds"] for r in good)
        threads = statistics.median(r["threads"] for r in good)
        medians[lane] = (fds, threads)
        print(f"LANE {lane}: N={opts.ranks}, per rank at rest: fds {fds:g}, threads {threads:g} "
              f"(medians of {len(good)} ranks)")
    if "default" in medians and "nofollow" in medians:
        (fds, threads), (fds0, threads0) = medians["default"], medians["nofollow"]
        print(f"FOLLOW COST per importer of {opts.ranks - 1} exporters: fds {fds - fds0:+g}, "
              f"threads {threads - threads0:+g}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
