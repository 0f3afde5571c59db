#!/usr/bin/env python3
"""Peer-buffer registration the way SGLang's custom all-reduce does it, four ways, alternated.

Each lane is one torchrun of tests/frameworks/sglang_vmm_path.py (two ranks on one GPU,
--tensors 64 x --tensor-mib 8 by default: get a handle of every tensor, all-gather them, open
every peer tensor, read each back, close), ROUNDS registrations in the same processes:

  legacy    legacy IPC on cudaMalloc memory (expandable_segments:False), no vmmipc: the reference
  vmmipc    legacy IPC on expandable-segment (VMM) memory through vmmipc, its defaults
  nofollow  the same with VMMIPC_FOLLOW=0 in both ranks (vmmipc's default before issue 43)
  ahead     the same with VMMIPC_AHEAD=1 in both ranks (runs mapped ahead)
  background the same with VMMIPC_BACKGROUND_EXPORT=1 in both ranks (each chunk exported by a
            thread soon after its map: the get is a lookup)
  sglang    SGLang's own VMM path (cuda_vmm_utils.py: POSIX fds over its own sockets, import and
            map at a fresh address), no vmmipc; needs --sglang-src

The lanes rotate for --reps repetitions, so that the host's drift falls on all of them. Printed:
per lane the median over every repetition of the first registration in a process (round 1) and
of the later ones (rounds 2..R, steady state), and the ratios to legacy. Exit 0 when every lane
that ran passed its own checks (every peer tensor read right), 1 otherwise.

  sglang_registration.py --lib build/csrc/libvmmipc.so [--sglang-src DIR] [--reps 2]
      [--rounds 6] [--tensors 64] [--tensor-mib 8] [--gap-s 0]
      [--lanes legacy,vmmipc,nofollow,ahead,background,sglang] [--out DIR]

--gap-s S: every rank waits S seconds between each round's allocation and its registration (the
registration of memory allocated a while before); the first registration is printed apart as
always.
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
HARNESS = os.path.join(HERE, "..", "frameworks", "sglang_vmm_path.py")
LANES = ("legacy", "vmmipc", "nofollow", "ahead", "background", "sglang")


def lane_run(lane, args, out_dir, rep):
    """One torchrun of the harness for `lane`; returns (ok, [seconds per round] of rank 0)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("VMMIPC_") and k not in ("LD_PRELOAD", "PYTORCH_CUDA_ALLOC_CONF")}
    env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:%s" % (
        "False" if lane == "legacy" else "True")
    if lane in ("vmmipc", "nofollow", "ahead", "background"):
        env["LD_PRELOAD"] = os.path.abspath(args.lib)
    if lane == "nofollow":
        env.update(VMMIPC_FOLLOW="0")
    if lane == "ahead":
        env.update(VMMIPC_AHEAD="1")
    if lane == "background":
        env.update(VMMIPC_BACKGROUND_EXPORT="1")
    prefix = os.path.join(out_dir, "%s-rep%d" % (lane, rep))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(29500 + rep * 7 + LANES.index(lane)), HARNESS,
           "--lanes", "sglang" if lane == "sglang" else "legacy",
           "--tensors", str(args.tensors), "--tensor-mib", str(args.tensor_mib),
           "--rounds", str(args.rounds), "--gap-s", str(args.gap_s), "--out", prefix]
    if lane == "sglang":
        cmd += ["--sglang-src", args.sglang_src]
    with open(prefix + ".log", "w") as log:
        try:
            rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                timeout=args.timeout_s).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    try:
        with open(prefix + ".rank0") as f:
            result = json.load(f)
    except (OSError, ValueError):
        return False, []
    times = result["sglang_ms"] if lane == "sglang" else result["legacy_ms"]
    return rc == 0, times


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", required=True, help="libvmmipc.so")
    parser.add_argument("--sglang-src", help="a folder holding sglang/srt/utils/cuda_vmm_utils.py")
    parser.add_argument("--lanes", default=",".join(LANES))
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--tensors", type=int, default=64)
    parser.add_argument("--tensor-mib", type=int, default=8)
    parser.add_argument("--timeout-s", type=int, default=180)
    parser.add_argument("--gap-s", type=float, default=0.0)
    parser.add_argument("--json", help="write the medians and ratios here too")
    parser.add_argument("--out", default="sglang-registration")
    args = parser.parse_args()
    lanes = [x for x in args.lanes.split(",") if x]
    if any(x not in LANES for x in lanes) or args.rounds < 2:
        parser.error("--lanes from %s; --rounds at least 2" % ",".join(LANES))
    if "sglang" in lanes and not args.sglang_src:
        print("sglang_registration: lane sglang not run: no --sglang-src")
        lanes.remove("sglang")
    os.makedirs(args.out, exist_ok=True)
    for stale in glob.glob(os.path.join(args.out, "*-rep*")):
        os.remove(stale)
    first = {x: [] for x in lanes}
    steady = {x: [] for x in lanes}
    failed = []
    for rep in range(args.reps):
        for i in range(len(lanes)):
            lane = lanes[(i + rep) % len(lanes)]
            ok, times = lane_run(lane, args, args.out, rep)
            print("sglang_registration: %s rep %d: %s, %s" % (
                lane, rep, "ok" if ok else "FAILED",
                " ".join("%.2f" % (t * 1e3) for t in times) + " ms"), flush=True)
            if not ok or len(times) != args.rounds:
                failed.append("%s rep %d (log %s-rep%d.log)" % (lane, rep, lane, rep))
                continue
            first[lane].append(times[0])
            steady[lane].extend(times[1:])
    med = lambda v: statistics.median(v) * 1e3 if v else None
    ref_first, ref_steady = med(first.get("legacy", [])), med(steady.get("legacy", []))
    print("\ngap between allocation and registration: %.2f s" % args.gap_s)
    print("\n| lane | first ms | steady ms | first / legacy | steady / legacy | samples |")
    print("| --- | --- | --- | --- | --- | --- |")
    for lane in lanes:
        f, s = med(first[lane]), med(steady[lane])
        r = lambda a, b: "%.2fx" % (a / b) if a is not None and b else "-"
        print("| %s | %s | %s | %s | %s | %d+%d |" % (
            lane, "%.2f" % f if f is not None else "-", "%.2f" % s if s is not None else "-",
            r(f, ref_first), r(s, ref_steady), len(first[lane]), len(steady[lane])))
        if s is not None and lane != "legacy":
            print("SUMMARY sglang-style %d x %d MiB, 2 ranks: %s steady %.2f ms = %s legacy" % (
                args.tensors, args.tensor_mib, lane, s, r(s, ref_steady)), file=sys.stderr)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"gap_s": args.gap_s, "tensors": args.tensors, "tensor_mib": args.tensor_mib,
                       "first_ms": {x: med(first[x]) for x in lanes},
                       "steady_ms": {x: med(steady[x]) for x in lanes},
                       "samples": {x: [len(first[x]), len(steady[x])] for x in lanes},
                       "failed": failed}, out)
    for f in failed:
        print("FAILED: " + f)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
