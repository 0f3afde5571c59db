#!/usr/bin/env python3
"""DeepEP's own intranode test, with its Buffer built inside a torch_memory_saver region.

Owns the DeepEP part of scripts/framework-check.sh. It runs test_loop() of
tests/test_intranode.py from a DeepEP source tree (DeepEP 1.x: one process a
GPU, NCCL group, deep_ep.Buffer with an NVL buffer, dispatch/combine checks and
tuning), against the deep_ep that Python imports (build and install DeepEP
first, per its README). With --memory-saver, deep_ep.Buffer.__init__ runs inside
torch_memory_saver.region(): in torch_memory_saver's preload mode, the
cudaMalloc of DeepEP's NVL buffer then returns VMM memory (cuMemCreate +
cuMemMap), as in a memory-saving RL or serving job, and DeepEP's
cudaIpcGetMemHandle on it fails unless vmmipc is preloaded.

  deepep_intranode.py --deepep-src DIR [--memory-saver] [--num-processes 2]
      [--num-tokens 4096 --hidden 7168 --num-topk 8 --num-experts 256]

For the memory saver, LD_PRELOAD must hold torch_memory_saver's
torch_memory_saver_hook_mode_preload*.so (scripts/framework-check.sh puts it
there). Exit status: 0 when every rank's test_loop returned, 1 otherwise.
"""

import argparse
import functools
import os
import socket
import sys

import torch


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wrap_buffer_in_region(deep_ep):
    """Makes every deep_ep.Buffer() allocate inside torch_memory_saver.region()."""
    from torch_memory_saver import torch_memory_saver

    original = deep_ep.Buffer.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        with torch_memory_saver.region():
            original(self, *args, **kwargs)
        print(f"[deepep_intranode rank {os.environ.get('LOCAL_RANK')}] deep_ep.Buffer built inside "
              "torch_memory_saver.region()", flush=True)

    deep_ep.Buffer.__init__ = __init__


def worker(local_rank, num_processes, args):
    # vmmipc takes its rank from LOCAL_RANK; torch.multiprocessing.spawn sets none.
    os.environ["LOCAL_RANK"] = str(local_rank)
    sys.path.insert(0, os.path.join(os.path.abspath(args.deepep_src), "tests"))
    import deep_ep

    if args.memory_saver:
        wrap_buffer_in_region(deep_ep)
    import test_intranode  # DeepEP's tests/test_intranode.py (imports its utils.py)

    test_args = argparse.Namespace(num_processes=num_processes, num_tokens=args.num_tokens,
                                   hidden=args.hidden, num_topk=args.num_topk,
                                   num_experts=args.num_experts, allow_mnnvl=False,
                                   use_fabric=False)
    test_intranode.test_loop(local_rank, num_processes, test_args)
    print(f"[deepep_intranode rank {local_rank}] test_loop returned", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deepep-src", required=True)
    parser.add_argument("--memory-saver", action="store_true")
    parser.add_argument("--num-processes", type=int, default=2)
    parser.add_argument("--num-tokens", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--num-topk", type=int, default=8)
    parser.add_argument("--num-experts", type=int, default=256)
    args = parser.parse_args()
    if not os.path.isfile(os.path.join(args.deepep_src, "tests", "test_intranode.py")):
        print(f"ERROR no tests/test_intranode.py in {args.deepep_src}", flush=True)
        return 2
    os.environ.setdefault("MASTER_PORT", str(free_port()))  # DeepEP's init_dist reads it
    import deep_ep  # fail here, in one process, when DeepEP is not installed

    print(f"deep_ep from {os.path.dirname(deep_ep.__file__)}; memory saver: {args.memory_saver}; "
          f"LD_PRELOAD={os.environ.get('LD_PRELOAD', '')}", flush=True)
    torch.multiprocessing.spawn(worker, args=(args.num_processes, args), nprocs=args.num_processes)
    print("RESULT deepep_intranode: every rank's test_loop returned", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
