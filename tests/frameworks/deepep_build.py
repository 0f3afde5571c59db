#!/usr/bin/env python3
"""Builds DeepEP's intranode path in place, without NVSHMEM, for scripts/framework-check.sh.

  deepep_build.py --deepep-src DIR

DeepEP 1.x's setup.py builds only its intranode kernels (runtime, layout,
intranode; -DDISABLE_NVSHMEM) when it finds no NVSHMEM: no NVSHMEM_DIR and no
importable nvidia.nvshmem. PyTorch's CUDA 13 wheels install nvidia.nvshmem, so
on a machine with torch setup.py would take the internode path (which needs
NVSHMEM's device library and compiles for minutes). This runs DeepEP's own
setup.py (`build_ext --inplace`) with nvidia.nvshmem hidden from its lookup and
NVSHMEM_DIR unset, so its own switch picks the intranode-only build. One build
fix, made to the extension setup.py declares rather than to DeepEP's files:
its SM90 flags compile with -rdc=true (relocatable device code), and only its
NVSHMEM path adds the device-link step that -rdc needs, so the no-NVSHMEM
module fails to import (undefined __cudaRegisterLinkedBinary_..._intranode_cu);
a plain nvcc -dlink step is added when -rdc=true has none. TORCH_CUDA_ARCH_LIST
defaults to 9.0 (H100/H200), as in DeepEP's setup.py; MAX_JOBS bounds ninja's
parallel compiles.

Then imports deep_ep from DIR in a fresh interpreter. Prints "BUILT DIR" (the
folder to put on PYTHONPATH) on success. Exit status: 0 built and importable,
1 otherwise.

Known: DeepEP commits after the mask-buffer change (e.g. 567632d) reference
internode_ll symbols outside the NVSHMEM guard, so their no-NVSHMEM build
compiles but does not import; the v1.2.1 tag builds and imports.
"""

import argparse
import importlib.util
import os
import runpy
import subprocess
import sys


def build_in_place(source):
    os.chdir(source)
    os.environ.pop("NVSHMEM_DIR", None)
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    real_find_spec = importlib.util.find_spec

    def find_spec_without_nvshmem(name, *args, **kwargs):
        # setup.py asks find_spec("nvidia.nvshmem").submodule_search_locations: None makes it
        # raise AttributeError, which setup.py catches as "no NVSHMEM".
        if name == "nvidia.nvshmem" or name.startswith("nvidia.nvshmem."):
            return None
        return real_find_spec(name, *args, **kwargs)

    importlib.util.find_spec = find_spec_without_nvshmem

    from torch.utils import cpp_extension
    real_cuda_extension = cpp_extension.CUDAExtension

    def cuda_extension_with_dlink(*args, **kwargs):
        # -rdc=true objects need nvcc -dlink before the host link; torch's BuildExtension runs
        # that step when extra_compile_args has "nvcc_dlink".
        compile_args = kwargs.get("extra_compile_args")
        if (isinstance(compile_args, dict) and "-rdc=true" in compile_args.get("nvcc", [])
                and not compile_args.get("nvcc_dlink")):
            compile_args["nvcc_dlink"] = ["-dlink"]
            print("deepep_build: -rdc=true without a device-link step: adding nvcc -dlink",
                  flush=True)
        return real_cuda_extension(*args, **kwargs)

    cpp_extension.CUDAExtension = cuda_extension_with_dlink
    sys.argv = ["setup.py", "build_ext", "--inplace"]
    sys.path.insert(0, source)
    runpy.run_path("setup.py", run_name="__main__")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deepep-src", required=True)
    args = parser.parse_args()
    source = os.path.abspath(args.deepep_src)
    if not os.path.isfile(os.path.join(source, "setup.py")):
        print(f"ERROR no setup.py in {source}: not a DeepEP 1.x source tree", flush=True)
        return 1
    child = os.fork()
    if child == 0:  # setup.py may call sys.exit and changes the directory: keep it apart
        try:
            build_in_place(source)
            os._exit(0)
        except SystemExit as stop:
            os._exit(stop.code if isinstance(stop.code, int) else 1)
        except BaseException as error:  # report any build failure as an exit status
            print(f"ERROR DeepEP's setup.py: {type(error).__name__}: {error}", flush=True)
            os._exit(1)
    _, status = os.waitpid(child, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        print(f"ERROR DeepEP's setup.py build_ext failed (exit {os.waitstatus_to_exitcode(status)})",
              flush=True)
        return 1
    env = dict(os.environ, PYTHONPATH=source + os.pathsep + os.environ.get("PYTHONPATH", ""))
    probe = subprocess.run(
        [sys.executable, "-c", "import deep_ep, deep_ep_cpp; print(deep_ep.__file__, deep_ep_cpp.__file__)"],
        env=env, cwd="/", capture_output=True, text=True)
    sys.stdout.write(probe.stdout + probe.stderr)
    if probe.returncode != 0:
        print(f"ERROR built, but deep_ep does not import from {source}", flush=True)
        return 1
    print(f"BUILT {source}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
