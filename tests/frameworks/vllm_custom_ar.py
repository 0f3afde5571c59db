#!/usr/bin/env python3
"""vLLM's custom all-reduce, driven the way vLLM drives it, on two or more GPUs.

Owns the vLLM part of scripts/framework-check.sh: it builds vLLM's own kernels
(csrc/custom_all_reduce.cu and .cuh of a vLLM source tree, nothing else of
vLLM) as a small torch extension, runs them under torchrun, and compares runs.

  vllm_custom_ar.py build --vllm-src DIR --build-dir DIR
      compiles csrc/custom_all_reduce.cu with tests/frameworks/vllm_custom_ar_binding.cpp;
      prints "BUILT <path of the .so>"
  torchrun --nproc-per-node N vllm_custom_ar.py run (--ext SO | --ops vllm) --out JSON [--latency]
      one rank per GPU, as vllm/distributed/device_communicators/custom_all_reduce.py
      does it: two shared cudaMalloc buffers (signals + staging) exchanged with
      cudaIpcGetMemHandle, init_custom_ar, register_buffer; all-reduce in eager
      mode; capture CUDA graphs, get_graph_buffer_ipc_meta (cudaIpcGetMemHandle
      on each captured input: PyTorch memory, VMM memory under expandable
      segments), register_graph_buffers, replay. Results are compared bit for
      bit with the sum computed on the CPU (the kernels add in float, in rank
      order, and round once, as the CPU does). With --latency, per-all-reduce
      time of graph replays for 8 KiB to 8 MiB. Rank 0 writes JSON: the checks,
      the registered peer pointers (read back from vLLM's rank_data), latencies.
  vllm_custom_ar.py compare --pointers A.json B.json | --vmmipc J... --legacy J...
      pointer identity of two fresh runs; the latency table of two configurations.

--ops vllm uses an installed vLLM's vllm._custom_ops instead of a build.
Exit status of run: 0 all checks passed, 1 a check failed. vLLM's own CUDACHECK
exits the process with status 1 and prints "Failed: Cuda error FILE:LINE '...'".
"""

import argparse
import importlib.util
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BINDING = os.path.join(HERE, "vllm_custom_ar_binding.cpp")
EXTENSION_NAME = "vllm_custom_ar"
KIB = 1 << 10
MIB = 1 << 20
RANK_DATA_BYTES = 8 * MIB  # vLLM's size for its rank_data tensor
RANK_DATA_ENTRY = 64  # sizeof(vllm::RankData): 8 pointers
LATENCY_SIZES = [8 * KIB << i for i in range(11)]  # 8 KiB ... 8 MiB
CHECK_SIZES = [8 * KIB, 64 * KIB, 1 * MIB, 8 * MIB]
LATENCY_TARGET = 0.03  # the bar: within 3% of legacy IPC


# --- build -------------------------------------------------------------------------------------

def cmd_build(args):
    csrc = os.path.join(os.path.abspath(args.vllm_src), "csrc")
    source = os.path.join(csrc, "custom_all_reduce.cu")
    if not os.path.isfile(source):
        newer = os.path.join(csrc, "libtorch_stable", "custom_all_reduce.cu")
        why = (" (this tree has csrc/libtorch_stable/custom_all_reduce.cu: a newer vLLM whose "
               "bindings use the stable torch ABI; use a 0.20.x tree, or an installed vLLM "
               "with --ops vllm)") if os.path.isfile(newer) else ""
        print(f"ERROR no {source}{why}", flush=True)
        return 2
    import torch.utils.cpp_extension as cpp_extension

    # One architecture keeps the compile short; the checks run on Hopper (sm_90) machines.
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    os.makedirs(args.build_dir, exist_ok=True)
    cuda_home = cpp_extension.CUDA_HOME or "/usr/local/cuda"
    module = cpp_extension.load(
        name=EXTENSION_NAME,
        sources=[BINDING, source],
        extra_include_paths=[csrc],
        extra_cflags=["-O3"],
        extra_cuda_cflags=["-O3"],
        # The kernels call cuPointerGetAttribute; link the driver through the toolkit's stub.
        extra_ldflags=[f"-L{cuda_home}/lib64/stubs", "-lcuda"],
        build_directory=os.path.abspath(args.build_dir),
        verbose=args.verbose,
    )
    print(f"BUILT {module.__file__}", flush=True)
    return 0


# --- run (one process per GPU, under torchrun) ---------------------------------------------------

def load_ops(args):
    if args.ops == "vllm":
        from vllm import _custom_ops as ops  # an installed vLLM: the same entry points
        return ops
    spec = importlib.util.spec_from_file_location(EXTENSION_NAME, args.ext)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Checks:
    """CHECK lines on stdout, and a record for the JSON file."""

    def __init__(self, rank):
        self.rank = rank
        self.items = []

    def check(self, name, ok, detail=""):
        self.items.append({"name": name, "ok": bool(ok), "detail": detail})
        print(f"CHECK rank{self.rank} vllm.{name} {'PASS' if ok else 'FAIL'} {detail}", flush=True)
        return ok

    def step(self, what):
        # Marks progress, so that a process that vLLM's CUDACHECK exits shows where it was.
        print(f"STEP rank{self.rank} {what}", flush=True)


def inputs_for(rank, world, numel, dtype, seed):
    """The input of `rank` and the expected sum, made on the CPU from seeds every rank knows."""
    import torch

    parts = []
    for r in range(world):
        generator = torch.Generator().manual_seed(seed * 16 + r)
        parts.append(torch.randn(numel, generator=generator, dtype=torch.float32).to(dtype))
    total = parts[0].float()
    for part in parts[1:]:
        total = total + part.float()  # vLLM's kernels: float accumulation in rank order
    return parts[rank], total.to(dtype)


def compare_result(out, expected):
    import torch

    got = out.cpu()
    if torch.equal(got, expected):
        return True, "bit-exact"
    diff = (got.float() - expected.float()).abs()
    return False, f"{int((diff > 0).sum())} of {got.numel()} differ, max |diff| {float(diff.max()):.3g}"


def create_shared_buffer(ops, size, rank, world):
    """vLLM's CustomAllreduce.create_shared_buffer: cudaMalloc + cudaIpcGetMemHandle, opened by peers."""
    import torch.distributed as dist

    pointer, handle = ops.allocate_shared_buffer_and_handle(size)
    handles = [None] * world
    dist.all_gather_object(handles, handle)
    return [pointer if i == rank else ops.open_mem_handle(h) for i, h in enumerate(handles)]


def register_graph_buffers(ops, fa, rank, world):
    """vLLM's CustomAllreduce.register_graph_buffers: exchange handles with broadcast_object_list."""
    import torch.distributed as dist

    handle, offset = ops.get_graph_buffer_ipc_meta(fa)
    all_data = [[None, None] for _ in range(world)]
    all_data[rank] = [handle, offset]
    for i in range(world):
        dist.broadcast_object_list(all_data[i], src=i, device="cpu")
    ops.register_graph_buffers(fa, [d[0] for d in all_data], [d[1] for d in all_data])
    return len(offset)


def read_rank_data(rank_data, entries, world):
    """The peer pointers vLLM registered: entries of 8 pointers in its rank_data tensor."""
    import torch

    raw = rank_data[: entries * RANK_DATA_ENTRY].view(torch.int64).view(entries, 8)
    return [[int(p) for p in row[:world]] for row in raw.cpu().tolist()]


def cmd_run(args):
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    # One GPU a rank; ranks share GPUs only when there are fewer GPUs than ranks (a smoke test:
    # kernels of two processes on one GPU take turns, so their timings mean nothing).
    torch.cuda.set_device(local_rank % torch.cuda.device_count())
    dist.init_process_group("gloo")  # vLLM's custom all-reduce works on a CPU (gloo) group
    rank, world = dist.get_rank(), dist.get_world_size()
    checks = Checks(rank)
    device = torch.device("cuda", torch.cuda.current_device())
    preload = os.environ.get("LD_PRELOAD", "")
    setting = {
        "world_size": world,
        "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "vmmipc_preloaded": "libvmmipc" in preload,
        "gpu": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "max_size": args.max_size,
    }
    print(f"SETTING rank{rank} {json.dumps(setting)}", flush=True)
    ops = load_ops(args)

    # As CustomAllreduce.__init__: signals + temporary buffer, staging buffer, rank_data.
    checks.step("create_shared_buffer (cudaMalloc + cudaIpcGetMemHandle + open)")
    meta_ptrs = create_shared_buffer(ops, ops.meta_size() + args.max_size, rank, world)
    buffer_ptrs = create_shared_buffer(ops, args.max_size, rank, world)
    rank_data = torch.empty(RANK_DATA_BYTES, dtype=torch.uint8, device=device)
    checks.step("init_custom_ar + register_buffer")
    fa = ops.init_custom_ar(meta_ptrs, rank_data, rank, True)
    ops.register_buffer(fa, buffer_ptrs)
    entries = 1
    dtypes = [torch.bfloat16, torch.float16, torch.float32]

    # Eager: the input is copied into the registered staging buffer, then reduced.
    checks.step("eager all-reduce")
    seed = 1
    for dtype in dtypes:
        for size in CHECK_SIZES:
            numel = size // torch.tensor([], dtype=dtype).element_size()
            mine, expected = inputs_for(rank, world, numel, dtype, seed)
            seed += 1
            inp = mine.to(device)
            out = torch.empty_like(inp)
            ops.all_reduce(fa, inp, out, buffer_ptrs[rank], args.max_size)
            torch.cuda.synchronize()
            ok, detail = compare_result(out, expected)
            checks.check(f"eager.{str(dtype).split('.')[-1]}.{size}", ok, detail)

    # Graph: inputs are PyTorch tensors (VMM memory under expandable segments), registered
    # after capture through cudaIpcGetMemHandle on their allocation's start.
    checks.step("capture the correctness graph")
    cases, graph_inputs = [], []
    for dtype in dtypes:
        for size in CHECK_SIZES:
            numel = size // torch.tensor([], dtype=dtype).element_size()
            cases.append((dtype, size, numel))
            graph_inputs.append(torch.zeros(numel, dtype=dtype, device=device))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_outputs = []
        for inp in graph_inputs:
            out = torch.empty_like(inp)
            ops.all_reduce(fa, inp, out, 0, 0)
            graph_outputs.append(out)
    latency_graphs = []
    if args.latency:
        checks.step("capture the latency graphs")
        for size in LATENCY_SIZES:
            inp = torch.randn(size // 2, dtype=torch.bfloat16, device=device)
            out = torch.empty_like(inp)
            latency_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(latency_graph):
                for _ in range(args.per_graph):
                    ops.all_reduce(fa, inp, out, 0, 0)
            latency_graphs.append((size, latency_graph, inp))
    own_graph_ptrs = [t.data_ptr() for t in graph_inputs] + [t.data_ptr() for _, _, t in latency_graphs]
    checks.step("get_graph_buffer_ipc_meta + register_graph_buffers")
    registered = register_graph_buffers(ops, fa, rank, world)
    checks.check("graph.registered", registered == len(graph_inputs) + args.per_graph * len(latency_graphs),
                 f"{registered} graph buffers")
    entries += registered
    pointers = read_rank_data(rank_data, entries, world)

    checks.step("replay")
    for replay in range(args.replays):
        expected_all = []
        for i, (dtype, size, numel) in enumerate(cases):
            mine, expected = inputs_for(rank, world, numel, dtype, 1000 + 100 * replay + i)
            graph_inputs[i].copy_(mine)
            expected_all.append(expected)
        torch.cuda.synchronize()
        dist.barrier()  # every rank's inputs are in place before any rank reads them
        graph.replay()
        torch.cuda.synchronize()
        dist.barrier()
        for i, (dtype, size, _) in enumerate(cases):
            ok, detail = compare_result(graph_outputs[i], expected_all[i])
            checks.check(f"graph.replay{replay}.{str(dtype).split('.')[-1]}.{size}", ok, detail)

    latency = {}
    if latency_graphs:
        checks.step("latency")
        for size, latency_graph, _ in latency_graphs:
            latency[str(size)] = time_graph(latency_graph, args)
            print(f"LATENCY rank{rank} {size} bytes: median "
                  f"{statistics.median(latency[str(size)]):.2f} us", flush=True)

    torch.cuda.synchronize()
    dist.barrier()  # nobody frees or closes memory a peer may still read
    ops.dispose(fa)
    dist.barrier()
    for pointers_of_buffer in (meta_ptrs, buffer_ptrs):
        ops.free_shared_buffer(pointers_of_buffer[rank])

    record = {
        "rank": rank,
        "setting": setting,
        "checks": checks.items,
        # rank_data entry 0: the staging buffer (cudaMalloc: legacy IPC pointers, the driver's
        # choice); entries 1...: the captured inputs (PyTorch memory), in capture order.
        "staging_peer_ptrs": pointers[0],
        "graph_peer_ptrs": pointers[1:],
        "graph_own_ptrs": own_graph_ptrs,
        "latency_us": latency,
        "per_graph": args.per_graph,
    }
    records = [None] * world
    dist.all_gather_object(records, record)
    failed = sum(1 for r in records for c in r["checks"] if not c["ok"])
    if rank == 0:
        with open(args.out, "w") as handle:
            json.dump({"ranks": records, "failed": failed}, handle, indent=1)
        passed = sum(1 for r in records for c in r["checks"] if c["ok"])
        print(f"SUMMARY vllm_custom_ar: {passed} PASS, {failed} FAIL ({world} ranks)", flush=True)
    dist.destroy_process_group()
    return 1 if failed else 0


def time_graph(graph, args):
    """Microseconds per all-reduce, one value per trial, from CUDA events around replays.

    No host barrier between trials: both ranks enqueue the same replays and the kernels'
    own start/end flags keep the GPUs in step, so a trial measures the GPUs, not the host.
    """
    import torch
    import torch.distributed as dist

    torch.cuda.synchronize()
    dist.barrier()
    for _ in range(args.warmup):
        graph.replay()
    marks = []
    for _ in range(args.trials):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.replays_per_trial):
            graph.replay()
        end.record()
        marks.append((start, end))
    torch.cuda.synchronize()
    count = args.replays_per_trial * args.per_graph
    return [start.elapsed_time(end) * 1000.0 / count for start, end in marks]


# --- compare ---------------------------------------------------------------------------------

def load_runs(paths):
    runs = []
    for path in paths:
        with open(path) as handle:
            runs.append(json.load(handle))
    return runs


def compare_pointers(first, second):
    """(ok, lines): the graph buffers' peer and own pointers of two runs, rank by rank."""
    lines, ok = [], True
    a_ranks = {r["rank"]: r for r in first["ranks"]}
    b_ranks = {r["rank"]: r for r in second["ranks"]}
    if sorted(a_ranks) != sorted(b_ranks):
        return False, [f"different ranks: {sorted(a_ranks)} and {sorted(b_ranks)}"]
    for rank in sorted(a_ranks):
        a, b = a_ranks[rank], b_ranks[rank]
        for key in ("graph_peer_ptrs", "graph_own_ptrs"):
            same = a[key] == b[key] and len(a[key]) > 0
            ok = ok and same
            sample = a[key][0] if a[key] else None
            if key == "graph_peer_ptrs" and sample is not None:
                sample = [hex(p) for p in sample]
            elif sample is not None:
                sample = hex(sample)
            lines.append(f"rank {rank} {key}: {len(a[key])} entries, "
                         f"{'identical' if same else 'DIFFERENT'} (first: {sample})")
        staging = a["staging_peer_ptrs"] == b["staging_peer_ptrs"]
        lines.append(f"rank {rank} staging_peer_ptrs (cudaMalloc, legacy IPC; not required): "
                     f"{'identical' if staging else 'different'}")
    return ok, lines


def pooled_median(runs, size):
    values = [v for run in runs for r in run["ranks"] for v in r["latency_us"].get(str(size), [])]
    return statistics.median(values) if values else None


def run_medians(runs, size):
    out = []
    for run in runs:
        values = [v for r in run["ranks"] for v in r["latency_us"].get(str(size), [])]
        out.append(statistics.median(values) if values else None)
    return out


def latency_table(vmmipc_runs, legacy_runs):
    """(met, missed, markdown lines): pooled medians per size and their ratio."""
    lines = ["| size | vmmipc + expandable (us) | legacy IPC, expandable off (us) | ratio | within 3% |",
             "| --- | --- | --- | --- | --- |"]
    met = missed = 0
    for size in LATENCY_SIZES:
        a, b = pooled_median(vmmipc_runs, size), pooled_median(legacy_runs, size)
        if a is None or b is None:
            lines.append(f"| {human(size)} | {fmt(a)} | {fmt(b)} | - | not measured |")
            continue
        ratio = a / b
        within = abs(ratio - 1.0) <= LATENCY_TARGET
        met, missed = met + within, missed + (not within)
        per_run = (f" (runs: {', '.join(fmt(x) for x in run_medians(vmmipc_runs, size))} / "
                   f"{', '.join(fmt(x) for x in run_medians(legacy_runs, size))})")
        lines.append(f"| {human(size)} | {a:.2f} | {b:.2f} | {ratio:.3f} | "
                     f"{'yes' if within else 'NO'}{per_run} |")
    return met, missed, lines


def human(size):
    return f"{size // MIB} MiB" if size >= MIB else f"{size // KIB} KiB"


def fmt(value):
    return "-" if value is None else f"{value:.2f}"


def cmd_compare(args):
    status = 0
    if args.pointers:
        ok, lines = compare_pointers(*load_runs(args.pointers))
        print(f"POINTERS {'IDENTICAL' if ok else 'DIFFERENT'} across two fresh runs")
        for line in lines:
            print("  " + line)
        status = status or (0 if ok else 1)
    if args.vmmipc and args.legacy:
        met, missed, lines = latency_table(load_runs(args.vmmipc), load_runs(args.legacy))
        print("\n".join(lines))
        print(f"LATENCY {met} sizes within 3%, {missed} outside (medians of all trials of "
              f"all runs, both ranks)")
    return status


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build")
    build.add_argument("--vllm-src", required=True)
    build.add_argument("--build-dir", required=True)
    build.add_argument("--verbose", action="store_true")
    run = sub.add_parser("run")
    where = run.add_mutually_exclusive_group(required=True)
    where.add_argument("--ext", help="the .so that `build` printed")
    where.add_argument("--ops", choices=["vllm"], help="an installed vLLM's vllm._custom_ops")
    run.add_argument("--out", required=True)
    # 16 MiB so that an 8 MiB input fits the eager staging buffer (vLLM's default is 8 MiB,
    # and it sends inputs of 8 MiB and more to NCCL).
    run.add_argument("--max-size", type=int, default=16 * MIB)
    run.add_argument("--replays", type=int, default=3)
    run.add_argument("--latency", action="store_true")
    run.add_argument("--per-graph", type=int, default=20, help="all-reduces in one latency graph")
    run.add_argument("--warmup", type=int, default=5)
    run.add_argument("--trials", type=int, default=30)
    run.add_argument("--replays-per-trial", type=int, default=4)
    compare = sub.add_parser("compare")
    compare.add_argument("--pointers", nargs=2, metavar="JSON")
    compare.add_argument("--vmmipc", nargs="+", metavar="JSON")
    compare.add_argument("--legacy", nargs="+", metavar="JSON")
    args = parser.parse_args(argv)
    return {"build": cmd_build, "run": cmd_run, "compare": cmd_compare}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
