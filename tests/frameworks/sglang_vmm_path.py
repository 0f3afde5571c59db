#!/usr/bin/env python3
"""SGLang's own VMM sharing path and vmmipc's legacy-IPC path, side by side in one process.

Owns the SGLang part of scripts/framework-check.sh. SGLang (0.5.2x) shares its
custom all-reduce's CUDA-graph inputs on expandable-segment (VMM) memory
without legacy IPC: sglang/srt/utils/cuda_vmm_utils.py votes for FABRIC
handles, falls back to POSIX fds sent over its own Unix sockets, and imports
and maps each peer allocation at a fresh driver-chosen address. This runs that
module's functions, loaded by path from an SGLang tree (--sglang-src: a folder
holding sglang/srt/utils/cuda_vmm_utils.py, e.g. the unpacked 0.5.23 wheel;
its one sglang import, log_info_on_rank0, gets a stand-in, so nothing else of
SGLang is needed), on real expandable-segment tensors, and then shares the
same tensors through cuIpcGetMemHandle / cuIpcOpenMemHandle, which works on
this memory only with vmmipc preloaded. Both read every peer tensor back.

  torchrun --nproc-per-node 2 sglang_vmm_path.py --sglang-src DIR [--tensors 16]
      [--tensor-mib 8] [--rounds 3] [--out JSON] [--lanes sglang,legacy] [--gap-s 0]

--lanes legacy runs the legacy-IPC lane alone (no SGLang tree needed), for the reference of
legacy IPC on cudaMalloc memory (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False, no vmmipc):
tests/bench/sglang_registration.py runs the three side by side.

Run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True. One rank per GPU
when there are two, else both on GPU 0. Prints CHECK <name> PASS|FAIL lines,
MEASURE lines (median wall time of the whole registration, both ranks, per
path) and SUMMARY. Without vmmipc the legacy path must fail with
CUDA_ERROR_INVALID_VALUE (reported as CHECK legacy.refused_without_vmmipc);
with it both paths must read right bytes. Exit: 0 when no CHECK failed.
"""

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
import types

import torch
import torch.distributed as dist
from cuda.bindings import driver as drv

CHECKS = []


def check(name, ok, detail=""):
    CHECKS.append((name, bool(ok)))
    print(f"CHECK rank{dist.get_rank()} {name} {'PASS' if ok else 'FAIL'} {detail}", flush=True)


def load_sglang_vmm_utils(source):
    """cuda_vmm_utils.py from an SGLang tree, with a stand-in for `sglang.srt.utils`."""
    path = os.path.join(os.path.abspath(source), "sglang", "srt", "utils", "cuda_vmm_utils.py")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: not an SGLang tree with the VMM utilities (0.5.2x)")
    # The module imports only log_info_on_rank0 from sglang; importing the real package would
    # pull in all of SGLang's dependencies.
    for name in ("sglang", "sglang.srt"):
        sys.modules.setdefault(name, types.ModuleType(name))
    utils = types.ModuleType("sglang.srt.utils")
    utils.log_info_on_rank0 = lambda logger, message: logger.info(message)
    sys.modules["sglang.srt.utils"] = utils
    spec = importlib.util.spec_from_file_location("sglang.srt.utils.cuda_vmm_utils", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, path


def ok(result, what):
    err = result[0]
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what}: {err.name}")
    return result[1] if len(result) > 1 else None


def allocation_bases(tensors):
    """The distinct VMM allocations (base, size) under the tensors, and each tensor's place."""
    bases, where = [], []
    for t in tensors:
        err, base, size = drv.cuMemGetAddressRange(t.data_ptr())
        ok((err,), "cuMemGetAddressRange")
        key = (int(base), int(size))
        if key not in bases:
            bases.append(key)
        where.append((bases.index(key), t.data_ptr() - int(base)))
    return bases, where


def read_back(pointer, nbytes, device):
    out = torch.empty(nbytes, dtype=torch.uint8, device=device)
    ok(drv.cuMemcpyDtoD(out.data_ptr(), pointer, nbytes), "cuMemcpyDtoD")
    torch.cuda.synchronize(device)
    return out


def pattern(rank, index, nbytes, device):
    return torch.full((nbytes,), (rank * 37 + index * 11 + 5) % 251, dtype=torch.uint8, device=device)


def sglang_round(vmm, tensors, rank, world, device_id):
    """SGLang's path: retain, export (FABRIC vote, POSIX fallback), exchange, import + map."""
    bases, where = allocation_bases(tensors)
    retained = [ok(drv.cuMemRetainAllocationHandle(base), "cuMemRetainAllocationHandle")
                for base, _ in bases]
    dist.barrier()
    t0 = time.perf_counter()
    use_fabric, peer_handles = vmm.exchange_shareable_handles(retained, dist.group.WORLD, rank, world)
    layouts = [None] * world
    dist.all_gather_object(layouts, (bases, where))
    mapped = {}
    for (peer, index), handle in peer_handles.items():
        size = layouts[peer][0][index][1]
        fd = None if use_fabric else handle
        va = vmm.import_and_map_alloc(handle if use_fabric else None, fd, size, device_id,
                                      use_fabric=use_fabric, peer_rank=peer)
        mapped[(peer, index)] = (va, size)
        if fd is not None:
            os.close(fd)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    for handle in retained:
        ok(drv.cuMemRelease(handle), "cuMemRelease")
    return use_fabric, mapped, layouts, elapsed


def legacy_round(tensors, rank, world):
    """Legacy IPC on the same tensors, as PyTorch shares a CUDA tensor: the handle of the
    allocation under it (cuMemGetAddressRange: a cudaMalloc segment, or an expandable segment's
    chunk), the offset sent beside it; all_gather; every peer tensor opened, offset added (a
    second open of one allocation's handle is the driver's reference-counted reopen)."""
    dist.barrier()
    t0 = time.perf_counter()
    mine = []
    for t in tensors:
        err, base, _ = drv.cuMemGetAddressRange(t.data_ptr())
        if err == drv.CUresult.CUDA_SUCCESS:
            err, handle = drv.cuIpcGetMemHandle(base)
        if err != drv.CUresult.CUDA_SUCCESS:
            return err, None, 0.0
        mine.append((bytes(handle.reserved), t.data_ptr() - int(base)))
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    opened = {}
    for peer in range(world):
        if peer == rank:
            continue
        for index, (raw, offset) in enumerate(everyone[peer]):
            handle = drv.CUipcMemHandle()
            handle.reserved = raw
            pointer = ok(drv.cuIpcOpenMemHandle(
                handle, drv.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), "cuIpcOpenMemHandle")
            opened[(peer, index)] = (int(pointer), offset)
    torch.cuda.synchronize()
    return drv.CUresult.CUDA_SUCCESS, opened, time.perf_counter() - t0


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sglang-src")
    parser.add_argument("--lanes", default="sglang,legacy",
                        help="comma list of sglang (SGLang's own VMM path) and legacy (IPC)")
    parser.add_argument("--tensors", type=int, default=16)
    parser.add_argument("--tensor-mib", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out")
    parser.add_argument("--gap-s", type=float, default=0.0,
                        help="seconds between each round's allocation and its registration")
    args = parser.parse_args()
    lanes = set(args.lanes.split(","))
    if not lanes or not lanes <= {"sglang", "legacy"}:
        parser.error("--lanes takes sglang and/or legacy")
    if "sglang" in lanes and not args.sglang_src:
        parser.error("the sglang lane needs --sglang-src")

    local_rank = int(os.environ["LOCAL_RANK"])
    gpus = torch.cuda.device_count()
    device_id = local_rank % gpus
    torch.cuda.set_device(device_id)
    device = torch.device("cuda", device_id)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    preloaded = "libvmmipc" in os.environ.get("LD_PRELOAD", "")
    vmm, path = (load_sglang_vmm_utils(args.sglang_src) if "sglang" in lanes
                 else (None, "not loaded (--lanes legacy)"))
    print(f"rank{rank}: GPU {device_id} of {gpus}; SGLang module {path}; vmmipc preloaded: "
          f"{preloaded}; allocator: {os.environ.get('PYTORCH_CUDA_ALLOC_CONF', 'default')}",
          flush=True)

    nbytes = args.tensor_mib << 20
    sglang_times, legacy_times, pointers = [], [], []
    for round_index in range(args.rounds):
        tensors = [pattern(rank, i, nbytes, device) for i in range(args.tensors)]
        torch.cuda.synchronize()
        if args.gap_s > 0:
            time.sleep(args.gap_s)  # memory allocated a while before its registration
        if "sglang" in lanes:
            sglang_lane(vmm, tensors, rank, world, device_id, device, round_index, sglang_times,
                        args.tensors)
        if "legacy" in lanes:
            legacy_lane(tensors, rank, world, device, round_index, preloaded, legacy_times,
                        pointers)
        dist.barrier()
        del tensors
        torch.cuda.empty_cache()

    line = f"MEASURE rank{rank}"
    result = {"rank": rank, "preloaded": preloaded, "sglang_ms": sglang_times,
              "legacy_ms": legacy_times, "tensors": args.tensors, "tensor_mib": args.tensor_mib,
              "allocator": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "default")}
    sglang_ms = statistics.median(sglang_times) * 1e3 if sglang_times else None
    if sglang_ms is not None:
        line += f" sglang_path_ms {sglang_ms:.2f}"
    if legacy_times:
        legacy_ms = statistics.median(legacy_times) * 1e3
        line += f" {'vmmipc_' if preloaded else ''}legacy_ipc_ms {legacy_ms:.2f}"
        if sglang_ms is not None:
            line += f" ratio_vmmipc_over_sglang {legacy_ms / sglang_ms:.2f}"
        result["first_peer_pointers"] = [hex(p) for _, p in pointers[0][:2]] if pointers else []
    print(line + f" (medians of {args.rounds} rounds, {args.tensors} x {args.tensor_mib} MiB "
          f"tensors a rank)", flush=True)
    if args.out:
        with open(f"{args.out}.rank{rank}", "w") as out:
            json.dump(result, out)
    failed = sum(1 for _, good in CHECKS if not good)
    print(f"SUMMARY rank{rank} sglang_vmm_path: {len(CHECKS) - failed} PASS, {failed} FAIL", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 1 if failed else 0


def sglang_lane(vmm, tensors, rank, world, device_id, device, round_index, sglang_times, count):
    """SGLang's own path on the tensors, timed, every peer tensor read back."""
    if round_index == 0:
        check("tensors_are_vmm_memory", vmm.is_vmm_pointer(tensors[0].data_ptr()),
              "(cuMemRetainAllocationHandle works: expandable segments)")
    use_fabric, mapped, layouts, elapsed = sglang_round(vmm, tensors, rank, world, device_id)
    sglang_times.append(elapsed)
    right = 0
    for peer in range(world):
        if peer == rank:
            continue
        for index, (base_index, offset) in enumerate(layouts[peer][1]):
            va, _ = mapped[(peer, base_index)]
            got = read_back(va + offset, 4096, device)
            right += bool(torch.equal(got, pattern(peer, index, 4096, device)))
    expected = (world - 1) * count
    if round_index == 0:
        check("sglang.path_reads_peer_tensors", right == expected,
              f"{right}/{expected} peer tensors right through SGLang's mappings "
              f"({'FABRIC' if use_fabric else 'POSIX fds'}, {len(mapped)} allocations)")
    vmm.release_mappings([(va, size, [(0, size)]) for va, size in mapped.values()])


def legacy_lane(tensors, rank, world, device, round_index, preloaded, legacy_times, pointers):
    """Legacy IPC on the tensors, timed, every peer tensor read back, every open closed.
    On expandable-segment memory only vmmipc makes it work; on cudaMalloc memory the driver."""
    err, opened, elapsed = legacy_round(tensors, rank, world)
    if opened is None:
        if round_index == 0:
            check("legacy.refused_without_vmmipc",
                  not preloaded and err == drv.CUresult.CUDA_ERROR_INVALID_VALUE,
                  f"cuIpcGetMemHandle on expandable-segment memory: {err.name}")
        return
    legacy_times.append(elapsed)
    right = sum(bool(torch.equal(read_back(pointer + offset, 4096, device),
                                 pattern(peer, index, 4096, device)))
                for (peer, index), (pointer, offset) in opened.items())
    if round_index == 0:
        check("legacy.reads_peer_tensors" + ("_with_vmmipc" if preloaded else ""),
              right == len(opened),
              f"{right}/{len(opened)} peer tensors right through cuIpcOpenMemHandle")
    pointers.append(sorted((key, pointer + offset) for key, (pointer, offset) in opened.items()))
    for pointer, _ in opened.values():
        ok(drv.cuIpcCloseMemHandle(pointer), "cuIpcCloseMemHandle")


if __name__ == "__main__":
    sys.exit(main())
