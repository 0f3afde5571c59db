#!/usr/bin/env python3
"""A memory saver's pause and resume with importers holding a handle, as a user runs it.

What it compares, in one run, lanes alternated round by round (each lane a fresh set of
processes):
  saver     torch_memory_saver alone: the exporter, no vmmipc, no importer (the saver's own
            pause and resume: the floor)
  default   the exporter with torch_memory_saver and libvmmipc.so, --importers importers with
            libvmmipc.so, no VMMIPC_* setting anywhere (the defaults)
  follow0   the same with VMMIPC_FOLLOW=0 in every process (legacy IPC's semantics; vmmipc's
            default before issue 43)
Each lane: the exporter allocates --size-gib GiB in a torch_memory_saver region (one tensor,
torch), fills it with 1 and hands out its legacy handle (cudaIpcGetMemHandle, through CuPy); each
importer opens it (cudaIpcOpenMemHandle, CuPy) and checks it reads 1. Then --cycles times:
pause (timed; then cuMemGetInfo settles: the bytes freed), resume (timed), the exporter fills
the next seed, every importer checks it reads that seed at its old pointer (on the GPU, a CuPy
comparison of the whole buffer) and writes seed + 100 into the first MiB, the exporter checks
it reads that. A cycle is right when every importer read the new seed and the exporter read
the importers' write.

Prints MEASURE lines per lane and cycle, then per lane: the cycles right, the GiB freed by
each pause, median pause and resume ms, and the default lane's ratios to the saver alone
(pause: x; resume: + ms per 8 GiB). Medians over every cycle of every round. The first
registration of the handle is not timed here.

  memory_saver_cycles.py --lib build/csrc/libvmmipc.so [--size-gib 8] [--importers 1]
      [--cycles 3] [--rounds 2] [--lanes saver,default,follow0] [--wheel W]

Needs torch, CuPy, torch_memory_saver (installed, or its wheel: --wheel, $MEMORY_SAVER_WHEEL,
.whl/torch_memory_saver-*.whl, as tests/python/memory_saver_check.py finds it) and a GPU; exit 77
when something is missing, 1 when a lane that should be right was not (default: every cycle
right and every pause freeing at least 90% of the buffer), else 0.
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

SKIP = 77
GIB = 1 << 30


def reply(obj):
    print("REPLY " + json.dumps(obj), flush=True)


# --- children ---------------------------------------------------------------------------------

class Exporter:
    def __init__(self, device):
        import torch  # pylint: disable=import-outside-toplevel
        import cupy  # pylint: disable=import-outside-toplevel
        from torch_memory_saver import torch_memory_saver  # pylint: disable=import-outside-toplevel
        self.torch, self.cupy, self.saver = torch, cupy, torch_memory_saver
        torch.cuda.set_device(device)
        self.tensor = None

    def do_setup(self, size, seed, share):
        with self.saver.region():
            self.tensor = self.torch.empty(size, dtype=self.torch.uint8, device="cuda")
        self.tensor.fill_(seed)
        self.torch.cuda.synchronize()
        # Without vmmipc (the saver-alone lane) legacy IPC refuses VMM memory: nothing shared.
        handle = self.cupy.cuda.runtime.ipcGetMemHandle(self.tensor.data_ptr()) if share else b""
        return {"handle": bytes(handle).hex(), "ptr": self.tensor.data_ptr()}

    def free(self, settle_s=1.0):
        best = self.torch.cuda.mem_get_info()[0]
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline:
            time.sleep(0.05)
            best = max(best, self.torch.cuda.mem_get_info()[0])
        return best

    def do_pause(self):
        self.torch.cuda.synchronize()
        before = self.torch.cuda.mem_get_info()[0]
        start = time.perf_counter()
        self.saver.pause()
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "freed": self.free() - before}

    def do_resume(self, seed):
        ptr = self.tensor.data_ptr()
        start = time.perf_counter()
        self.saver.resume()
        seconds = time.perf_counter() - start
        self.tensor.fill_(seed)
        self.torch.cuda.synchronize()
        return {"seconds": seconds, "same_address": self.tensor.data_ptr() == ptr}

    def do_check_head(self, seed):
        head = self.tensor[: 1 << 20]
        return {"right": bool((head == seed).all().item())}


class Importer:
    def __init__(self, device):
        import cupy  # pylint: disable=import-outside-toplevel
        self.cupy = cupy
        cupy.cuda.Device(device).use()
        self.ptr, self.array = None, None

    def do_open(self, handle, size):
        cupy = self.cupy
        self.ptr = cupy.cuda.runtime.ipcOpenMemHandle(bytes.fromhex(handle))
        memory = cupy.cuda.UnownedMemory(self.ptr, size, self)
        self.array = cupy.ndarray((size,), dtype=cupy.uint8,
                                  memptr=cupy.cuda.MemoryPointer(memory, 0))
        return {"ptr": self.ptr}

    def do_check(self, seed):
        # A slice at a time: a comparison of the whole buffer would allocate a boolean array
        # as large as it (32 GiB did not fit beside the buffer itself).
        step = 1 << 30
        right = all(bool((self.array[at:at + step] == seed).all().item())
                    for at in range(0, self.array.size, step))
        return {"right": right}

    def do_write_head(self, seed):
        self.array[: 1 << 20].fill(seed)
        self.cupy.cuda.Device().synchronize()
        return {}

    def do_close(self):
        if self.ptr is not None:
            self.cupy.cuda.runtime.ipcCloseMemHandle(self.ptr)
            self.ptr, self.array = None, None
        return {}


def child_main(role, device):
    try:
        worker = {"exporter": Exporter, "importer": Importer}[role](device)
        startup = None
    except Exception as exc:  # pylint: disable=broad-except
        worker, startup = None, {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    for line in sys.stdin:
        msg = json.loads(line)
        cmd = msg.pop("cmd")
        if cmd == "exit":
            break
        if startup is not None:
            reply(startup)
            continue
        try:
            out = getattr(worker, "do_" + cmd)(**msg)
            out.setdefault("ok", True)
        except Exception as exc:  # pylint: disable=broad-except
            out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        reply(out)
    return 0


# --- the parent -------------------------------------------------------------------------------

class Child(saver_check.Child):
    """memory_saver_check's child, running this script's roles."""

    def __init__(self, role, env, folder, tag):  # pylint: disable=super-init-not-called
        self.role, self.tag = role, tag
        self.log_path = os.path.join(folder, f"{tag}.{role}.stderr")
        self.log = open(self.log_path, "w+", encoding="utf-8", errors="replace")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--role", role.split(".")[0]],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        saver_check._CHILDREN.append(self.proc)  # pylint: disable=protected-access
        self.lines = saver_check.queue.Queue()
        saver_check.threading.Thread(target=self._pump, daemon=True).start()
        self.broken = None

    def must(self, timeout, cmd, **fields):
        out = self.ask(timeout, cmd, **fields)
        if not out.get("ok"):
            raise saver_check.ChildError(f"{self.role} {cmd}: {out.get('error')}")
        return out


def lane_env(base, lane, lib, saver_env):
    """(exporter env, importer env): the saver's preload (and vmmipc's, but in the saver lane)."""
    exporter = dict(saver_env)
    if lane == "saver":
        exporter["LD_PRELOAD"] = ":".join(p for p in exporter["LD_PRELOAD"].split(":")
                                          if "libvmmipc" not in os.path.basename(p))
    importer = dict(base, LD_PRELOAD=lib)
    for child, rank in ((exporter, 0), (importer, 1)):
        child.update(VMMIPC_RANK=str(rank), VMMIPC_STATS="1")
        if lane == "follow0":
            child["VMMIPC_FOLLOW"] = "0"
    return exporter, importer


def run_lane(opts, lane, round_index, lib, saver_env, folder, results):
    exporter_env, importer_env = lane_env(os.environ, lane, lib, saver_env)
    size = int(opts.size_gib * GIB)
    tag = f"{lane}.r{round_index}"
    exporter = Child("exporter", exporter_env, folder, tag)
    importers = [] if lane == "saver" else [
        Child(f"importer.{i}", dict(importer_env, VMMIPC_RANK=str(i + 1)), folder, tag)
        for i in range(opts.importers)]
    children = [exporter] + importers
    try:
        setup = exporter.must(300, "setup", size=size, seed=1, share=lane != "saver")
        for importer in importers:
            importer.must(120, "open", handle=setup["handle"], size=size)
            if not importer.must(120, "check", seed=1)["right"]:
                raise saver_check.ChildError(f"{importer.role} does not read the first fill")
        for cycle in range(opts.cycles):
            paused = exporter.must(300, "pause")
            seed = 2 + cycle
            resumed = exporter.must(300, "resume", seed=seed)
            right = resumed["same_address"]
            for i, importer in enumerate(importers):
                right = importer.must(120, "check", seed=seed)["right"] and right
                importer.must(120, "write_head", seed=seed + 100 + i)
                right = exporter.must(120, "check_head", seed=seed + 100 + i)["right"] and right
            row = {"lane": lane, "round": round_index, "cycle": cycle,
                   "pause_ms": paused["seconds"] * 1e3, "resume_ms": resumed["seconds"] * 1e3,
                   "freed_gib": paused["freed"] / GIB, "right": bool(right)}
            results.append(row)
            print(f"MEASURE {tag}.cycle{cycle} pause_ms={row['pause_ms']:.2f} "
                  f"resume_ms={row['resume_ms']:.2f} freed_gib={row['freed_gib']:.2f} "
                  f"right={row['right']}", flush=True)
        for importer in importers:
            importer.must(120, "close")
    except saver_check.ChildError as exc:
        print(f"ERROR {tag}: {exc}", flush=True)
        for child in children:
            child.dump_stderr()
        results.append({"lane": lane, "round": round_index, "error": str(exc)})
    finally:
        for child in importers + [exporter]:
            child.finish()
    for child in children:
        text = child.stderr_text()
        warnings = [l for l in text.splitlines() if "warning:" in l]
        for line in warnings[:3]:
            print(f"LOG {tag}.{child.role} {line}", flush=True)


def summarize(opts, results):
    failed = False
    by_lane = {}
    for row in results:
        by_lane.setdefault(row["lane"], []).append(row)
    medians = {}
    for lane, rows in by_lane.items():
        cycles = [r for r in rows if "error" not in r]
        errors = [r for r in rows if "error" in r]
        if not cycles:
            print(f"LANE {lane}: no cycle ran ({len(errors)} errors)")
            failed = failed or lane == "default"
            continue
        right = sum(r["right"] for r in cycles)
        pause = statistics.median(r["pause_ms"] for r in cycles)
        resume = statistics.median(r["resume_ms"] for r in cycles)
        freed = [r["freed_gib"] for r in cycles]
        medians[lane] = (pause, resume)
        print(f"LANE {lane}: cycles right {right}/{len(cycles)}; freed by each pause "
              f"{min(freed):.2f}-{max(freed):.2f} GiB of {opts.size_gib:g}; pause median "
              f"{pause:.2f} ms, resume median {resume:.2f} ms; errors {len(errors)}")
        if lane == "default":
            failed = (failed or errors != [] or right != len(cycles)
                      or min(freed) < 0.9 * opts.size_gib)
    if "default" in medians and "saver" in medians:
        (pause, resume), (alone_pause, alone_resume) = medians["default"], medians["saver"]
        per8 = (resume - alone_resume) * 8 / opts.size_gib
        print(f"RATIO default/saver: pause {pause / alone_pause:.2f}x; resume +{per8:.2f} ms per "
              f"8 GiB (target: pause <= 1.2x, resume <= +1 ms per 8 GiB)")
    return failed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lib", default=os.path.join(os.path.dirname(os.path.dirname(HERE)),
                                                      "build", "csrc", "libvmmipc.so"))
    parser.add_argument("--size-gib", type=float, default=8)
    parser.add_argument("--importers", type=int, default=1)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--lanes", default="saver,default,follow0")
    parser.add_argument("--wheel", default=None)
    parser.add_argument("--out", default=None, help="folder for the children's logs")
    parser.add_argument("--role", choices=("exporter", "importer"), help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.role:
        return child_main(opts.role, 0)
    for module in ("torch", "cupy"):
        if saver_check.importlib.util.find_spec(module) is None:
            print(f"SKIP: {module} is not installed")
            return SKIP
    lib = os.path.abspath(opts.lib)
    if not os.path.isfile(lib):
        print(f"SKIP: no {lib}")
        return SKIP
    folder = opts.out or tempfile.mkdtemp(prefix="memory-saver-cycles-")
    os.makedirs(folder, exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith("VMMIPC_")}
    base["LD_PRELOAD"] = lib
    saver_opts = types.SimpleNamespace(wheel=opts.wheel, saver_order="saver-first")
    try:
        saver_env, how = saver_check.prepare_saver(saver_opts, base, folder)
    except saver_check._Skip as exc:  # pylint: disable=protected-access
        print(f"SKIP: {exc}")
        return SKIP
    print(f"INFO torch_memory_saver: {how}", flush=True)
    print(f"INFO {opts.size_gib:g} GiB, {opts.importers} importer(s), {opts.cycles} cycles x "
          f"{opts.rounds} rounds, lanes {opts.lanes}; logs in {folder}", flush=True)
    results = []
    lanes = [lane for lane in opts.lanes.split(",") if lane]
    for round_index in range(opts.rounds):
        order = lanes if round_index % 2 == 0 else list(reversed(lanes))
        for lane in order:
            run_lane(opts, lane, round_index, lib, saver_env, folder, results)
    with open(os.path.join(folder, "memory_saver_cycles.json"), "w", encoding="utf-8") as out:
        json.dump(results, out, indent=1)
    return 1 if summarize(opts, results) else 0


if __name__ == "__main__":
    sys.exit(main())
