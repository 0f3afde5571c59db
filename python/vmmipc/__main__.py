"""python -m vmmipc: where the installed library is, the preload for a shell, and the
configuration the library would settle here.

  python -m vmmipc --lib         prints the path of libvmmipc.so (exit 1 if there is none)
  python -m vmmipc --print-env   prints `export LD_PRELOAD=...` for eval in a shell
  python -m vmmipc --config      prints vmmipc-config's JSON report for this environment
  python -m vmmipc demo          runs the demo: two processes share VMM memory through legacy
                                 IPC, on the GPU, else on the simulated driver the wheel ships
                                 (--simulated: on it even with a GPU); also --demo
  python -m vmmipc --version

Everything else is the launcher's: vmmipc-run --help (the module vmmipc.run).
"""

import argparse
import json
import os
import shlex
import sys

import vmmipc


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["demo"]:  # the subcommand spelling of --demo
        argv[0] = "--demo"
    parser = argparse.ArgumentParser(
        prog="python -m vmmipc",
        description="Where libvmmipc.so is, how to preload it, and the configuration it "
                    "would settle here. To run a command with it, or check this machine: "
                    "vmmipc-run.")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--lib", action="store_true", help="print the path of libvmmipc.so")
    what.add_argument("--print-env", action="store_true",
                      help="print LD_PRELOAD with libvmmipc.so first, as a shell export line")
    what.add_argument("--config", action="store_true",
                      help="print the settled configuration (every VMMIPC_* variable, the "
                           "layout, the rank, the sockets) as JSON, from vmmipc-config")
    what.add_argument("--version", action="store_true", help="print the version")
    what.add_argument("--demo", action="store_true",
                      help="run the demo (also `python -m vmmipc demo`): on the GPU, else on "
                           "the simulated driver shipped in the wheel")
    parser.add_argument("--simulated", action="store_true",
                        help="with --demo: on the simulated driver even where there is a GPU")
    args = parser.parse_args(argv)
    if args.simulated and not args.demo:
        parser.error("--simulated goes with --demo")
    if args.version:
        print(vmmipc.__version__)
        return 0
    if args.demo:
        from vmmipc import demo

        return demo.main(simulated=True if args.simulated else None)
    if args.config:
        return print_config()
    try:
        library = vmmipc.library_path()
    except FileNotFoundError as error:
        print(f"python -m vmmipc: {error}", file=sys.stderr)
        return 1
    if args.lib:
        print(library)
    else:
        env = vmmipc.preload_env(library=library)
        print(f"export LD_PRELOAD={shlex.quote(env['LD_PRELOAD'])}")
    return 0


def print_config():
    from vmmipc import paths, settled

    library, _ = paths.find_library(None)
    try:
        config = settled.settle(os.environ, library=library)
    except settled.ToolError as error:
        print(f"python -m vmmipc: {error}", file=sys.stderr)
        return 1
    print(json.dumps(config.document, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
