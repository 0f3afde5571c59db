#!/usr/bin/env python3
"""What VMMIPC_EXPORT_ON_MAP=1 costs a PyTorch process that grows its memory after sharing.

With the variable, a process that has shared VMM memory exports every chunk it maps
afterwards (on vmmipc's listener thread, while the exported-fd cache is under half full).
This measures that cost where it would land: a PyTorch process with expandable segments
(20 MiB chunks) shares one tensor through cuIpcGetMemHandle (so vmmipc's listener runs),
then allocates GiB-sized tensors, as a KV cache or activations growing would, timing each
allocation (torch.empty + synchronize) and counting its open fds afterwards. Run it with
vmmipc preloaded, once with VMMIPC_EXPORT_ON_MAP=0 and once with 1, and compare:

  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True LD_PRELOAD=libvmmipc.so \\
    VMMIPC_EXPORT_ON_MAP=1 python3 export_on_map_cost.py [--gib 1] [--tensors 8]

Prints one RESULT line: the median and total allocation time, and the fds before and after.
"""

import argparse
import os
import statistics
import time

import torch
from cuda.bindings import driver as drv


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=1.0, help="size of each tensor")
    parser.add_argument("--tensors", type=int, default=8)
    args = parser.parse_args()
    torch.cuda.init()
    shared = torch.ones(1 << 20, device="cuda")
    torch.cuda.synchronize()
    err, _ = drv.cuIpcGetMemHandle(shared.data_ptr())
    if err != drv.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"cuIpcGetMemHandle on the shared tensor: {err.name} (is vmmipc preloaded, "
                         "expandable segments on?)")
    time.sleep(0.2)  # the get's own export ahead is done
    fds_before = len(os.listdir("/proc/self/fd"))
    times, tensors = [], []
    nbytes = int(args.gib * (1 << 30))
    for _ in range(args.tensors):
        t0 = time.perf_counter()
        tensors.append(torch.empty(nbytes, dtype=torch.uint8, device="cuda"))
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    time.sleep(1.0)  # let exports on map finish before counting fds
    fds_after = len(os.listdir("/proc/self/fd"))
    print(f"RESULT export_on_map={os.environ.get('VMMIPC_EXPORT_ON_MAP', '0')} "
          f"{args.tensors} x {args.gib} GiB: allocation median {statistics.median(times) * 1e3:.2f} ms, "
          f"total {sum(times) * 1e3:.1f} ms; fds {fds_before} -> {fds_after}", flush=True)


if __name__ == "__main__":
    main()
