"""python -m vmmipc: where the installed library is, the preload for a shell, and the
configuration the library would settle here.

  python -m vmmipc --lib         prints the path of libvmmipc.so (exit 1 if there is none)
  python -m vmmipc --print-env   prints `export LD_PRELOAD=...` for eval in a shell
  python -m vmmipc --config      prints vmmipc-config's JSON report for this environment
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
    args = parser.parse_args(argv)
    if args.version:
        print(vmmipc.__version__)
        return 0
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
