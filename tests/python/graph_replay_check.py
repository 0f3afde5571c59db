#!/usr/bin/env python3
"""A CUDA graph captured over peer memory replays correctly, with the same
baked-in pointer in fresh runs (issue 4: what a graph save/load tool relies on).

An EXPORTER process (PyTorch, expandable segments, VMMIPC_RANK=0) fills a
tensor and hands out its legacy IPC handle. A fresh IMPORTER process
(cuda.bindings, VMMIPC_RANK=1) opens it, captures a graph that copies the peer
memory into a local buffer, replays it, then writes new bytes into the peer
memory through its mapping and replays the SAME graph again: the replay must
see the new bytes (the graph reads live peer memory). The exporter then checks
that the importer's bytes landed in its tensor. The importer runs twice, in
fresh processes: the peer pointer baked into the graph must be identical.

Run with libvmmipc.so in LD_PRELOAD. Exit 0 on success, 1 on failure, 77 when
it cannot run here (no torch, no cuda.bindings, no GPU). Prints CHECK lines.
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_ipc_check import Driver  # noqa: E402  (cuda.bindings wrapper, never raises)

SIZE = 32 << 20
SKIP = 77


def check(name, ok, detail):
    print(f"CHECK graph.{name} {'PASS' if ok else 'FAIL'} {detail}", flush=True)
    return ok


def exporter():
    import torch  # only the exporter needs torch
    tensor = torch.full((SIZE,), 1, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    drv = Driver()
    err, raw, name = drv.get_handle(tensor.data_ptr())
    if err:
        print(f"ERROR cuIpcGetMemHandle: {name}", flush=True)
        return 1
    print(f"HANDLE {raw.hex()} {tensor.data_ptr():#x}", flush=True)
    for line in sys.stdin:
        words = line.split()
        if words and words[0] == "fill":
            tensor.fill_(int(words[1]))
            torch.cuda.synchronize()
            print("FILLED", flush=True)
        elif words and words[0] == "expect":
            value = int(words[1])
            torch.cuda.synchronize()
            bad = int((tensor != value).sum().item())
            print(f"RESULT {bad}", flush=True)
        elif words and words[0] == "exit":
            break
    return 0


def importer(handle_hex):
    drv = Driver()
    d = drv.drv
    why = drv.make_context_current(0)
    if why:
        print(f"ERROR context: {why}", flush=True)
        return 1
    err, peer, name = drv.open_handle(bytes.fromhex(handle_hex))
    if err:
        print(f"ERROR cuIpcOpenMemHandle: {name}", flush=True)
        return 1
    ok = True

    def call(fn, *args):
        nonlocal ok
        err, value, name = drv.call(fn, *args)
        if err:
            ok = False
            print(f"ERROR {fn}: {name}", flush=True)
        return value

    local = call("cuMemAlloc", SIZE)
    stream = call("cuStreamCreate", 0)
    call("cuStreamBeginCapture", stream, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)
    call("cuMemcpyDtoDAsync", local, drv.ptr(peer), SIZE, stream)
    graph = call("cuStreamEndCapture", stream)
    graph_exec = call("cuGraphInstantiate", graph, 0)
    if not ok:
        return 1
    for value in (1, 7):
        if value == 7:  # new bytes in the peer memory, same graph
            drv.write(peer, bytes([7]) * SIZE)
            drv.sync()
        call("cuMemsetD8", local, 0, SIZE)
        call("cuGraphLaunch", graph_exec, stream)
        call("cuStreamSynchronize", stream)
        data = drv.read(local, SIZE)
        bad = sum(1 for b in data[:: 4096] if b != value) + (data.count(value) != SIZE)
        print(f"REPLAY {value} {'ok' if bad == 0 else 'bad'}", flush=True)
    call("cuGraphExecDestroy", graph_exec)
    call("cuGraphDestroy", graph)
    drv.close_handle(peer)
    print(f"PEER {peer:#x}", flush=True)
    return 0 if ok else 1


def main():
    try:
        import torch  # noqa: F401
        from torch_ipc_check import load_driver_module
        load_driver_module()
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device")
    except Exception as exc:  # pylint: disable=broad-except
        print(f"SKIP: {exc}")
        return SKIP
    if "libvmmipc" not in os.environ.get("LD_PRELOAD", ""):
        print("SKIP: libvmmipc.so is not in LD_PRELOAD")
        return SKIP
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True", VMMIPC_RANK="0")
    exp = subprocess.Popen([sys.executable, __file__, "--exporter"], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True, env=env)
    failed = False
    try:
        first = exp.stdout.readline().split()
        if not first or first[0] != "HANDLE":
            return 0 if check("exporter_handle", False, " ".join(first)) else 1
        handle, exporter_ptr = first[1], first[2]
        check("exporter_handle", True, f"tensor {exporter_ptr}")
        peers = []
        for run in (1, 2):
            exp.stdin.write("fill 1\n")  # each run starts from the exporter's bytes being 1
            exp.stdin.flush()
            if exp.stdout.readline().strip() != "FILLED":
                failed |= not check(f"run{run}.exporter_fill", False, "no answer")
                break
            env_i = dict(os.environ, VMMIPC_RANK="1")
            out = subprocess.run([sys.executable, __file__, "--importer", handle], env=env_i,
                                 capture_output=True, text=True, timeout=120)
            lines = out.stdout.splitlines()
            replays = [l for l in lines if l.startswith("REPLAY")]
            peer = next((l.split()[1] for l in lines if l.startswith("PEER")), None)
            peers.append(peer)
            failed |= not check(f"run{run}.replay_reads_peer", "REPLAY 1 ok" in replays,
                                f"{replays[:1]} exit {out.returncode} {out.stderr[-300:]!r}")
            failed |= not check(f"run{run}.replay_sees_new_peer_bytes",
                                "REPLAY 7 ok" in replays, f"{replays}")
            exp.stdin.write("expect 7\n")
            exp.stdin.flush()
            result = exp.stdout.readline().split()
            failed |= not check(f"run{run}.writes_landed_in_exporter",
                                result == ["RESULT", "0"], " ".join(result))
            failed |= not check(f"run{run}.importer_exit", out.returncode == 0,
                                f"exit {out.returncode}")
        failed |= not check("baked_pointer_identical_in_fresh_runs",
                            peers[0] is not None and peers[0] == peers[1], f"{peers}")
    finally:
        try:
            exp.stdin.write("exit\n")
            exp.stdin.flush()
            exp.wait(timeout=30)
        except Exception:  # pylint: disable=broad-except
            exp.kill()
    print(f"SUMMARY graph_replay_check: {'FAIL' if failed else 'PASS'}")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--exporter":
        sys.exit(exporter())
    if len(sys.argv) > 2 and sys.argv[1] == "--importer":
        sys.exit(importer(sys.argv[2]))
    sys.exit(main())
