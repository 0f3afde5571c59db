#!/usr/bin/env python3
"""What VMMIPC_BACKGROUND_EXPORT=1 costs where users allocate: PyTorch processes with vmmipc
preloaded (expandable segments), with the background export off and on, alternated, one fresh
process per measurement, medians of --repeats:

  growth     expandable-segment growth of --gib GiB (tensors of 512 MiB; each new chunk the
             caching allocator maps is queued for the background export), synchronized
  memcpy     model-load-like traffic right after it, while the chunks are mapped and being
             exported: cudaMemcpy (Tensor.copy_) of every byte from pinned host memory
  rest       fds and threads of the process at rest after both (the fd count unchanged for
             300 ms, at most 20 s): what the background export keeps
  free       the tensors dropped and torch.cuda.empty_cache() (the unmaps close the kept fds)
  resume     a memory saver's resume of --gib GiB (torch_memory_saver: pause, then resume
             timed), in a child of its own: the saver wants its library in LD_PRELOAD (before
             vmmipc's) and refuses expandable segments. torch_memory_saver installed, or its
             wheel (--wheel, $MEMORY_SAVER_WHEEL, .whl/torch_memory_saver-*.whl), as
             tests/python/memory_saver_check.py finds it; else said, not measured

  background_export_cost.py --lib build/csrc/libvmmipc.so [--gib 8] [--repeats 3] [--json PATH]
      [--wheel W]

Prints a table (off, on, on/off per measurement) and, with --json, the same as JSON.
Exit 0 when every child ran; 1 otherwise.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import memory_saver_check as saver_check  # noqa: E402  (finds and preloads torch_memory_saver)

MEASURES = ("growth_ms", "memcpy_ms", "free_ms", "resume_ms", "rest_fds", "rest_threads",
            "fds_kept_by_mode")


def count(path):
    try:
        return len(os.listdir(path))
    except OSError:
        return -1


def at_rest(quiet_s=0.3, bound_s=20.0):
    """(fds, threads) once the fd count has not changed for quiet_s (at most bound_s)."""
    start = time.monotonic()
    last, since = count("/proc/self/fd"), time.monotonic()
    while time.monotonic() - since < quiet_s and time.monotonic() - start < bound_s:
        time.sleep(0.01)
        now = count("/proc/self/fd")
        if now != last:
            last, since = now, time.monotonic()
    return last, count("/proc/self/task")


def cuda_device():
    import torch

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    torch.empty(1, device=device)  # the context
    torch.cuda.synchronize()
    return torch, device


def child_allocation(gib):
    torch, device = cuda_device()
    result = {}
    fresh_fds, _ = at_rest()
    piece = 512 << 20
    pieces = max(1, (gib << 30) // piece)
    t0 = time.perf_counter()
    tensors = [torch.empty(piece, dtype=torch.uint8, device=device) for _ in range(pieces)]
    torch.cuda.synchronize()
    result["growth_ms"] = (time.perf_counter() - t0) * 1e3
    host = torch.empty(piece, dtype=torch.uint8).pin_memory()
    t0 = time.perf_counter()
    for t in tensors:
        t.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    result["memcpy_ms"] = (time.perf_counter() - t0) * 1e3
    result["rest_fds"], result["rest_threads"] = at_rest()
    result["fds_kept_by_mode"] = result["rest_fds"] - fresh_fds
    t0 = time.perf_counter()
    del tensors
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    result["free_ms"] = (time.perf_counter() - t0) * 1e3
    return result


def child_resume(gib):
    """A memory saver's resume of gib GiB, timed (the saver's library preloaded)."""
    torch, device = cuda_device()
    from torch_memory_saver import torch_memory_saver as saver

    with saver.region():
        held = torch.empty(gib << 30, dtype=torch.uint8, device=device)
    torch.cuda.synchronize()
    saver.pause()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    saver.resume()
    torch.cuda.synchronize()
    result = {"resume_ms": (time.perf_counter() - t0) * 1e3}
    del held
    return result


def child(gib, part):
    result = child_allocation(gib) if part == "allocation" else child_resume(gib)
    result["mode"] = os.environ.get("VMMIPC_BACKGROUND_EXPORT", "0")
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def run_child(env, part, args):
    """The child's RESULT dict; raises on a failed child."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", part,
                          "--gib", str(args.gib)], env=env, capture_output=True, text=True,
                         timeout=args.timeout_s)
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError("exit %d: %s" % (out.returncode, out.stderr[-2000:]))
    return json.loads(lines[-1][len("RESULT "):])


def saver_environment(base, wheel, notes):
    """The resume child's environment (the saver's library first in LD_PRELOAD), or None."""
    folder = tempfile.mkdtemp(prefix="background-export-cost-")
    try:
        env, how = saver_check.prepare_saver(
            types.SimpleNamespace(wheel=wheel, saver_order="saver-first"), base, folder)
    except saver_check._Skip as exc:  # pylint: disable=protected-access
        notes.add("resume not measured: %s" % exc)
        return None
    print("background_export_cost: torch_memory_saver: %s" % how, flush=True)
    return env


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", help="libvmmipc.so (preloaded into every child)")
    parser.add_argument("--gib", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout-s", type=int, default=120)
    parser.add_argument("--wheel", help="a torch_memory_saver wheel, when it is not installed")
    parser.add_argument("--json")
    parser.add_argument("--child", choices=("allocation", "resume"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.gib, args.child)
    if not args.lib:
        parser.error("--lib is required")
    runs = {"0": [], "1": []}
    notes, failed = set(), []
    base = {k: v for k, v in os.environ.items() if not k.startswith("VMMIPC_")}
    base["LD_PRELOAD"] = os.path.abspath(args.lib)
    saver_env = saver_environment(base, args.wheel, notes)
    for rep in range(args.repeats):
        for mode in (("0", "1") if rep % 2 == 0 else ("1", "0")):
            result = {}
            parts = [("allocation", dict(base, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True"))]
            if saver_env is not None:
                parts.append(("resume", saver_env))
            for part, env in parts:
                try:
                    result.update(run_child(dict(env, VMMIPC_BACKGROUND_EXPORT=mode), part, args))
                except Exception as e:  # noqa: BLE001 - a failed child is reported, the rest go on
                    failed.append("background export %s rep %d %s: %s" % (mode, rep, part, e))
                    print("FAILED: " + failed[-1], flush=True)
            runs[mode].append(result)
            print("background_export_cost: background export %s rep %d: %s" % (
                "on" if mode == "1" else "off", rep,
                ", ".join("%s %s" % (k, "%.1f" % v if isinstance(v, float) else v)
                          for k, v in result.items() if k in MEASURES)), flush=True)

    def med(mode, key):
        values = [r[key] for r in runs[mode] if isinstance(r.get(key), (int, float))]
        return statistics.median(values) if values else None

    table = {}
    print("\n%d GiB, expandable segments, vmmipc preloaded; medians of %d repeats" % (
        args.gib, args.repeats))
    print("| measurement | off | on | on / off |")
    print("| --- | --- | --- | --- |")
    for key in MEASURES:
        off, on = med("0", key), med("1", key)
        ratio = on / off if off and on is not None else None
        table[key] = {"off": off, "on": on, "ratio": ratio}
        cell = lambda v: "-" if v is None else ("%.1f" % v)
        print("| %s | %s | %s | %s |" % (key, cell(off), cell(on),
                                          "-" if ratio is None else "%.2fx" % ratio))
        if key.endswith("_ms") and ratio is not None:
            print("SUMMARY background export cost: %s %.1f ms on, %.1f ms off = %.2fx" % (
                key[:-3], on, off, ratio), file=sys.stderr)
    for note in sorted(notes):
        print("note: " + note)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"gib": args.gib, "repeats": args.repeats, "medians": table,
                       "runs": runs, "notes": sorted(notes), "failed": failed}, out, indent=1)
    for f in failed:
        print("FAILED: " + f)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
