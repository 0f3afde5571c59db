"""The arguments of the two checks, the same as scripts/gpu-check.sh and
scripts/framework-check.sh took, plus --list and --dry-run; then the engine."""

import argparse
import dataclasses
import os

from . import describe, framework_set, gpu_set
from .engine import Runner
from .steps import env_int

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _parser():
    parser = argparse.ArgumentParser(
        prog="gpu_check", description=__doc__.split("\n")[0],
        epilog="scripts/gpu-check.sh and scripts/framework-check.sh run this with gpu and "
        "framework.")
    sets = parser.add_subparsers(dest="set", metavar="{gpu,framework}")
    sets.required = True
    raw = argparse.RawDescriptionHelpFormatter
    gpu = sets.add_parser("gpu", help="the GPU check (scripts/gpu-check.sh)",
                          description=gpu_set.__doc__, formatter_class=raw,
                          usage="scripts/gpu-check.sh [OUTDIR] [--list | --dry-run]")
    gpu.add_argument("outdir", nargs="?", help="the output folder (default $OUT, else "
                     "$GPU_CHECK_BUILD_DIR/report)")
    env = os.environ.get
    fw = sets.add_parser("framework", help="the framework check (scripts/framework-check.sh)",
                         description=framework_set.__doc__, formatter_class=raw,
                         usage="scripts/framework-check.sh [options]")
    fw.add_argument("--lib", default=env("VMMIPC_LIB") or None)
    fw.add_argument("--vllm-src", default=env("VLLM_SRC") or None)
    fw.add_argument("--vllm-ext", default=env("VLLM_EXT") or None)
    fw.add_argument("--deepep-src", default=env("DEEPEP_SRC") or None)
    fw.add_argument("--deepep-build", action="store_true",
                    default=env("DEEPEP_BUILD", "0") not in ("", "0"))
    fw.add_argument("--saver-wheel", default=env("MEMORY_SAVER_WHEEL") or None)
    fw.add_argument("--sglang-src", default=env("SGLANG_SRC") or None)
    fw.add_argument("--out", default=env("OUT") or None)
    for sub in (gpu, fw):
        sub.add_argument("--list", action="store_true", help="the steps, one line each")
        sub.add_argument("--dry-run", action="store_true",
                         help="the steps with their conditions and commands; nothing is run")
    return parser


def _out(path):
    """Relative output folders are taken from the repository root, as the scripts did."""
    return os.path.normpath(os.path.join(REPO, path))


def main(argv):
    args = _parser().parse_args(argv)
    env = dict(os.environ)
    dry = args.list or args.dry_run
    if args.set == "gpu":
        build_dir = env.get("GPU_CHECK_BUILD_DIR") or "build-gpu"
        out = _out(args.outdir or env.get("OUT") or os.path.join(build_dir, "report"))
        ctx = gpu_set.GpuContext(REPO, out, env, dry_run=dry)
        check, skip = gpu_set.check_set(ctx), env.get("GPU_CHECK_SKIP", "")
    else:
        build_dir = env.get("FRAMEWORK_CHECK_BUILD_DIR") or "build"
        out = _out(args.out or os.path.join(build_dir, "framework-report"))
        ctx = framework_set.FrameworkContext(REPO, out, env, args, dry_run=dry)
        check, skip = framework_set.check_set(ctx), ""
    check = dataclasses.replace(check, budget_s=env_int(env, check.budget_var, check.budget_s))
    if args.list:
        print(describe.listing(check))
        return 0
    if args.dry_run:
        print(describe.dry_run(check, ctx, skip))
        return 0
    os.chdir(REPO)
    return Runner(check, ctx, skip).run()
