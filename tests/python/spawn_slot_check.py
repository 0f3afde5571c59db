#!/usr/bin/env python3
"""Framework workers without a rank variable get the same peer addresses in
every fresh run (issue 13), the way SGLang and vLLM start theirs: two
torch.multiprocessing "spawn" workers, no VMMIPC_RANK, LOCAL_RANK or RANK,
each sharing a tensor (expandable segments, so VMM memory) with the other
through cuIpcGetMemHandle / cuIpcOpenMemHandle.

Layouts, each run twice in fresh processes:
  one-gpu              both workers on GPU 0, device chosen by ordinal
  one-gpu-visible      both with CUDA_VISIBLE_DEVICES=0
  one-gpu-gpu-arena    as one-gpu-visible, with VMMIPC_RANK_FROM=gpu (export arena on)
  two-gpus             worker i on GPU i by ordinal
  two-gpus-visible     worker i with CUDA_VISIBLE_DEVICES=i (each sees device 0)
  two-gpus-gpu-arena   as two-gpus-visible, with VMMIPC_RANK_FROM=gpu (export arena on)
Checked in each: the slot in each handle is the exporter GPU's index among the
host's GPUs in PCI order; the peer pointer lies in that slot of the import
zone and is identical in both runs; data goes both ways; a CUDA graph captured
over the peer pointer replays the peer's bytes, and the pointer baked into it
is identical in both runs. With the arena on, each worker's own tensor address
is also identical in both runs and inside the arena; without it, the own
addresses are only reported (MEASURE lines).

Run with libvmmipc.so in LD_PRELOAD. Exit 0 when every check passed, 1 on a
failure, 77 when it cannot run here. Prints CHECK, MEASURE and SUMMARY lines.
"""
import argparse
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_ipc_check import Driver  # noqa: E402  (cuda.bindings wrapper, never raises)

SKIP = 77
SIZE = 8 << 20  # bytes per shared tensor: 4 chunks of 2 MiB
ZONE_BASE = int(os.environ.get("VMMIPC_ZONE_BASE", "0x300000000000"), 0)
SLOT_SIZE = 1 << 40  # the default VMMIPC_SLOT_SIZE; the check sets no other
ARENA_BASE = int(os.environ.get("VMMIPC_ARENA_BASE", "0x200000000000"), 0)
HOST_GPU_LIST = "/proc/driver/nvidia/gpus"
WAIT_S = 120

LAYOUTS = {
    "one-gpu": {"gpus": (0, 0), "visible": False, "env": {}},
    "one-gpu-visible": {"gpus": (0, 0), "visible": True, "env": {}},
    "one-gpu-gpu-arena": {"gpus": (0, 0), "visible": True, "env": {"VMMIPC_RANK_FROM": "gpu"}},
    "two-gpus": {"gpus": (0, 1), "visible": False, "env": {}},
    "two-gpus-visible": {"gpus": (0, 1), "visible": True, "env": {}},
    "two-gpus-gpu-arena": {"gpus": (0, 1), "visible": True, "env": {"VMMIPC_RANK_FROM": "gpu"}},
}


def slot_of(raw):
    """The rank slot field of a VMM2 handle (bytes 6-7, little-endian; docs/blob-format.md)."""
    if raw[:4] != b"VMM2":
        return None
    slot = int.from_bytes(raw[6:8], "little")
    return None if slot == 0xFFFF else slot


def host_index(props):
    """The GPU's index in the host's list, sorted by PCI address; None if not found."""
    try:
        names = os.listdir(HOST_GPU_LIST)
    except OSError:
        return None
    addresses = []
    for name in names:
        try:
            domain, bus, rest = name.split(":")
            device, function = rest.split(".")
            addresses.append((int(domain, 16), int(bus, 16), int(device, 16), int(function, 16)))
        except ValueError:
            continue
    mine = (props.pci_domain_id, props.pci_bus_id, props.pci_device_id, 0)
    addresses.sort()
    return addresses.index(mine) if mine in addresses else None


# --- the worker ---------------------------------------------------------------------------

def wait_for(path):
    deadline = time.monotonic() + WAIT_S
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {WAIT_S} s for {path}")
        time.sleep(0.01)


def post(path, text=""):
    with open(path + ".tmp", "w") as out:
        out.write(text)
    os.rename(path + ".tmp", path)


def baked_source(drv, graph):
    """The source pointer of the one memcpy node of `graph`, as the driver stored it."""
    d = drv.drv
    out = d.cuGraphGetNodes(graph)  # (err, nodes, count): first the count, then the nodes
    count = int(out[2]) if int(out[0]) == 0 and len(out) > 2 else 0
    if count:
        out = d.cuGraphGetNodes(graph, count)
    if int(out[0]) != 0:
        return None
    for node in out[1] or []:
        err, params = d.cuGraphMemcpyNodeGetParams(node)
        if int(err) == 0:
            return int(params.srcDevice)
    return None


def worker(rank, layout_name, folder):
    layout = LAYOUTS[layout_name]
    gpu = layout["gpus"][rank]
    if layout["visible"]:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)  # before CUDA starts, as vLLM does
    device = 0 if layout["visible"] else gpu
    peer = 1 - rank
    result = {"rank": rank, "gpu": gpu, "device": device, "errors": []}
    try:
        import torch
        torch.cuda.set_device(device)
        props = torch.cuda.get_device_properties(device)
        result["pci"] = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        result["host_index"] = host_index(props)
        tensor = torch.full((SIZE,), rank + 1, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        result["own_ptr"] = tensor.data_ptr()
        drv = Driver()
        err, raw, name = drv.get_handle(tensor.data_ptr())
        if err:
            raise RuntimeError(f"cuIpcGetMemHandle: {name}")
        result["own_slot"] = slot_of(raw)
        post(os.path.join(folder, f"handle{rank}"), raw.hex())
        wait_for(os.path.join(folder, f"handle{peer}"))
        with open(os.path.join(folder, f"handle{peer}")) as text:
            peer_raw = bytes.fromhex(text.read())
        result["peer_slot"] = slot_of(peer_raw)
        err, pointer, name = drv.open_handle(peer_raw)
        if err:
            raise RuntimeError(f"cuIpcOpenMemHandle: {name}")
        result["peer_ptr"] = pointer
        # Read the peer's bytes, then write the second half of its tensor.
        data = drv.read(pointer, SIZE)
        result["read_ok"] = data.count(peer + 1) == SIZE
        drv.write(pointer + SIZE // 2, bytes([10 + rank]) * (SIZE // 2))
        drv.sync()
        # A graph over the peer pointer: capture, read what is baked in, replay.
        d = drv.drv
        err, local, name = drv.call("cuMemAlloc", SIZE)
        err2, stream, name2 = drv.call("cuStreamCreate", 0)
        if err or err2:
            raise RuntimeError(f"cuMemAlloc/cuStreamCreate: {name} {name2}")
        drv.call("cuStreamBeginCapture", stream,
                 d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)
        drv.call("cuMemcpyDtoDAsync", local, drv.ptr(pointer), SIZE, stream)
        err, graph, name = drv.call("cuStreamEndCapture", stream)
        if err:
            raise RuntimeError(f"cuStreamEndCapture: {name}")
        try:
            result["baked"] = baked_source(drv, graph)
        except Exception as exc:  # pylint: disable=broad-except
            result["errors"].append(f"reading the graph's memcpy node: {exc}")
            result["baked"] = None
        err, graph_exec, name = drv.call("cuGraphInstantiate", graph, 0)
        if err:
            raise RuntimeError(f"cuGraphInstantiate: {name}")
        post(os.path.join(folder, f"wrote{rank}"))
        wait_for(os.path.join(folder, f"wrote{peer}"))  # the peer has written our second half
        drv.call("cuGraphLaunch", graph_exec, stream)
        drv.call("cuStreamSynchronize", stream)
        replay = drv.read(int(local), SIZE)
        result["replay_ok"] = (replay[: SIZE // 2].count(peer + 1) == SIZE // 2
                               and replay[SIZE // 2:].count(10 + rank) == SIZE // 2)
        torch.cuda.synchronize()
        mine = tensor.cpu()
        result["written_ok"] = (int((mine[: SIZE // 2] != rank + 1).sum()) == 0
                                and int((mine[SIZE // 2:] != 10 + peer).sum()) == 0)
        drv.call("cuGraphExecDestroy", graph_exec)
        drv.call("cuGraphDestroy", graph)
        drv.call("cuMemFree", local)
        post(os.path.join(folder, f"done{rank}"))
        wait_for(os.path.join(folder, f"done{peer}"))  # keep our memory until the peer is done
        err, name = drv.close_handle(pointer)
        if err:
            result["errors"].append(f"cuIpcCloseMemHandle: {name}")
    except Exception as exc:  # pylint: disable=broad-except
        result["errors"].append(f"{type(exc).__name__}: {exc}")
        post(os.path.join(folder, f"done{rank}"))
    post(os.path.join(folder, f"result{rank}.json"), json.dumps(result))


# --- the parent -----------------------------------------------------------------------------

class Checks:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0

    def check(self, name, ok, detail=""):
        print(f"CHECK {name} {'PASS' if ok else 'FAIL'} {detail}".rstrip(), flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        return ok

    def skip(self, name, why):
        print(f"CHECK {name} SKIP {why}", flush=True)
        self.skipped += 1


def run_layout(name, spawn):
    """Two workers of one layout, fresh processes; their result dicts."""
    layout = LAYOUTS[name]
    saved = dict(os.environ)
    try:
        for variable in ("VMMIPC_RANK", "LOCAL_RANK", "RANK", "CUDA_VISIBLE_DEVICES",
                         "VMMIPC_RANK_FROM"):
            os.environ.pop(variable, None)
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        os.environ.update(layout["env"])
        with tempfile.TemporaryDirectory(prefix="vmmipc-spawn-") as folder:
            spawn(worker, args=(name, folder), nprocs=2, join=True)
            results = []
            for rank in (0, 1):
                with open(os.path.join(folder, f"result{rank}.json")) as text:
                    results.append(json.load(text))
            return results
    finally:
        os.environ.clear()
        os.environ.update(saved)


def judge(checks, name, runs):
    layout = LAYOUTS[name]
    for run, results in enumerate(runs, 1):
        for r in results:
            tag = f"{name}.run{run}.worker{r['rank']}"
            if r["errors"]:
                checks.check(f"{tag}.ran", False, "; ".join(r["errors"]))
                continue
            want = r.get("host_index")
            checks.check(f"{tag}.slot_is_host_gpu_index", want is not None and r["own_slot"] == want,
                         f"GPU {r['gpu']} ({r['pci']}): handle slot {r['own_slot']}, host index "
                         f"{want}")
            peer_slot = r["peer_slot"]
            lo = ZONE_BASE + (peer_slot or 0) * SLOT_SIZE
            checks.check(f"{tag}.peer_in_its_slot",
                         peer_slot is not None and lo <= r["peer_ptr"] < lo + SLOT_SIZE,
                         f"peer pointer {r['peer_ptr']:#x}, slot {peer_slot}")
            checks.check(f"{tag}.data_both_ways", r["read_ok"] and r["written_ok"],
                         f"read {r['read_ok']}, written {r['written_ok']}")
            checks.check(f"{tag}.graph_replays_peer_bytes", r["replay_ok"] and
                         r["baked"] == r["peer_ptr"],
                         f"replay {r['replay_ok']}, baked {r['baked'] and hex(r['baked'])}")
    if len(runs) < 2 or any(r["errors"] for results in runs for r in results):
        return
    for rank in (0, 1):
        first, second = runs[0][rank], runs[1][rank]
        tag = f"{name}.worker{rank}"
        checks.check(f"{tag}.peer_pointer_same_in_two_runs", first["peer_ptr"] == second["peer_ptr"],
                     f"{first['peer_ptr']:#x} vs {second['peer_ptr']:#x}")
        checks.check(f"{tag}.baked_pointer_same_in_two_runs", first["baked"] == second["baked"],
                     f"{first['baked'] and hex(first['baked'])} vs "
                     f"{second['baked'] and hex(second['baked'])}")
        same_own = first["own_ptr"] == second["own_ptr"]
        if layout["env"].get("VMMIPC_RANK_FROM") == "gpu":
            checks.check(f"{tag}.own_pointer_same_and_in_arena",
                         same_own and ARENA_BASE <= first["own_ptr"] < ARENA_BASE + SLOT_SIZE,
                         f"{first['own_ptr']:#x} vs {second['own_ptr']:#x}")
        else:
            print(f"MEASURE {tag}.own_pointer_without_arena {first['own_ptr']:#x} vs "
                  f"{second['own_ptr']:#x} ({'same' if same_own else 'different'})", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layouts", default=",".join(LAYOUTS),
                        help="comma-separated subset of: " + ", ".join(LAYOUTS))
    args = parser.parse_args()
    try:
        import torch
        import torch.multiprocessing as mp
        from torch_ipc_check import load_driver_module
        load_driver_module()
        gpus = torch.cuda.device_count()  # NVML-based: CUDA is not initialised in the parent
    except Exception as exc:  # pylint: disable=broad-except
        print(f"SKIP: {exc}")
        return SKIP
    if gpus < 1:
        print("SKIP: no GPU")
        return SKIP
    if "libvmmipc" not in os.environ.get("LD_PRELOAD", ""):
        print("SKIP: libvmmipc.so is not in LD_PRELOAD")
        return SKIP
    checks = Checks()
    for name in args.layouts.split(","):
        if name not in LAYOUTS:
            print(f"unknown layout {name}", file=sys.stderr)
            return 2
        if max(LAYOUTS[name]["gpus"]) >= gpus:
            checks.skip(name, f"needs {max(LAYOUTS[name]['gpus']) + 1} GPUs, found {gpus}")
            continue
        runs = []
        for _ in (1, 2):
            try:
                runs.append(run_layout(name, mp.spawn))
            except Exception as exc:  # pylint: disable=broad-except
                checks.check(f"{name}.spawn", False, f"{type(exc).__name__}: {exc}")
                break
        judge(checks, name, runs)
    print(f"SUMMARY spawn_slot_check: {checks.passed} PASS, {checks.failed} FAIL, "
          f"{checks.skipped} SKIP", flush=True)
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
