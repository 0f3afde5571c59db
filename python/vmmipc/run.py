"""vmmipc-run: run a command with libvmmipc.so preloaded, or check this machine.

  vmmipc-run [options] -- CMD...   prepend libvmmipc.so to LD_PRELOAD, set the
                                   VMMIPC_* variables the options ask for, exec CMD
  vmmipc-run --check               what a user needs to know before a run, and a
                                   VERDICT line (OK / WARN / FAIL)
  vmmipc-run --print-env           the same environment as shell `export` lines

This module is the launcher's command line and run mode: `vmmipc-run` is the console
script of the Python package (pip install .) and scripts/vmmipc-run a thin wrapper
around it (a source tree, and cmake --install's bin/). The pieces are found by
vmmipc.paths; what the library makes of the variables an option sets is asked of
vmmipc-config (vmmipc.settled); --check is vmmipc.check. Python 3.8+, standard
library only.
"""

import argparse
import os
import shlex
import subprocess
import sys

import vmmipc
from vmmipc import check, options, paths
from vmmipc.preload import is_vmmipc, prepend_path, prepend_preload, split_preload
from vmmipc.settled import ToolError, settle

VERSION = vmmipc.__version__  # tests/scripts checks it against project() in CMakeLists.txt
DEEPEP_VARIABLE = "DEEPEP_VMMIPC"  # read by python/sitecustomize.py


def run_environment(args, library, env):
    """The environment changes for CMD: {name: value}."""
    changes = {"LD_PRELOAD": prepend_preload(env.get("LD_PRELOAD"), library)}
    if args.rank is not None:
        changes["VMMIPC_RANK"] = args.rank  # as typed: the library judges it (settle_options)
    if args.log_level is not None:
        changes["VMMIPC_LOG_LEVEL"] = args.log_level
    if args.stats:
        changes["VMMIPC_STATS"] = "1"
    if args.socket_dir is not None:
        changes["VMMIPC_SOCKET_DIR"] = os.path.abspath(args.socket_dir)
    if args.log_file is not None:
        # Absolute, so that every process of the job writes where the option said,
        # whatever its working directory (%h and %p are kept for the library).
        changes["VMMIPC_LOG_FILE"] = os.path.abspath(args.log_file)
    if args.deepep:
        pydir = paths.python_dir()
        if pydir is None:
            raise SystemExit("vmmipc-run: --deepep: the vmmipc sitecustomize hook is not "
                             "installed beside this package (share/vmmipc/python, python/ "
                             "of a source tree, or vmmipc/_site of a wheel)")
        changes[DEEPEP_VARIABLE] = "1"
        changes["PYTHONPATH"] = prepend_path(env.get("PYTHONPATH"), pydir)
    return changes


def settle_options(args, changes, library):
    """Asks vmmipc-config what the library makes of the variables the options set:
    a value it would refuse is a usage error, the log level is written as the library
    names it, a socket directory it would not use is warned about. Returns an exit
    status, or None to go on."""
    if args.rank is None and args.log_level is None and args.socket_dir is None:
        return None
    env = dict(os.environ)
    env.update(changes)
    try:
        config = settle(env, library=library)
    except ToolError as error:
        print(f"vmmipc-run: cannot check the options: {error}", file=sys.stderr)
        return 1
    problem = options.first_refused(changes, config)
    if problem:
        print(f"vmmipc-run: error: {problem}", file=sys.stderr)
        return 2
    if args.log_level is not None:
        changes["VMMIPC_LOG_LEVEL"] = config.text("VMMIPC_LOG_LEVEL")
    sockets = config.sockets
    if args.socket_dir is not None and not sockets["usable"]:
        directory, why = sockets["dir"], sockets["why"]
        if sockets["problem"] in ("missing", "not_directory"):
            print(f"vmmipc-run: warning: --socket-dir {directory} {why}: exporters will not be "
                  "able to listen (create it, mode 0700)", file=sys.stderr)
        else:
            print(f"vmmipc-run: warning: --socket-dir {directory} {why}: exporters will not "
                  "listen and importers will not connect there", file=sys.stderr)
    return None


def parse_arguments(argv):
    parser = argparse.ArgumentParser(
        prog="vmmipc-run",
        usage="vmmipc-run [options] -- CMD...\n       vmmipc-run --check [options]",
        description="Run CMD with libvmmipc.so preloaded (legacy CUDA IPC on VMM memory), "
                    "or check whether this machine can use it.",
        epilog="Exit status of --check: 0 OK, 2 WARN, 1 FAIL. " + options.docs_pointer())
    parser.add_argument("--check", action="store_true",
                        help="check this machine and print a VERDICT line; runs no command")
    parser.add_argument("--print-env", action="store_true",
                        help="print the environment CMD would get, as shell export lines")
    parser.add_argument("--variables", action="store_true",
                        help="print every VMMIPC_* variable (default, values it accepts, "
                             "meaning) as a markdown table; runs no command")
    parser.add_argument("--lib", metavar="PATH",
                        help="libvmmipc.so to preload (default: next to this script's install, "
                             "or $BUILD_DIR/csrc of a source tree)")
    parser.add_argument("--rank", metavar="N",
                        help="VMMIPC_RANK=N (one process only: launchers that start several "
                             "ranks set LOCAL_RANK themselves)")
    parser.add_argument("--log-level", metavar="LEVEL",
                        help="VMMIPC_LOG_LEVEL: trace, debug, info, warn, error or off")
    parser.add_argument("--log-file", metavar="NAME",
                        help="VMMIPC_LOG_FILE=NAME: log lines to that file instead of stderr; "
                             "%%h is the host name, %%p the pid (one file per process)")
    parser.add_argument("--stats", action="store_true",
                        help="VMMIPC_STATS=1: counters on stderr when each process exits")
    parser.add_argument("--socket-dir", metavar="DIR",
                        help="VMMIPC_SOCKET_DIR=DIR: filesystem sockets in DIR (ranks in "
                             "different network namespaces)")
    parser.add_argument("--deepep", action="store_true",
                        help=f"{DEEPEP_VARIABLE}=1 and the vmmipc Python hook on PYTHONPATH: "
                             "DeepEP's NVL buffer takes the legacy IPC path (docs/recipes.md)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="print the environment changes on stderr before running CMD")
    parser.add_argument("--version", action="version", version=f"vmmipc-run {VERSION}")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run")
    args = parser.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if args.check and args.command:
        parser.error("--check runs no command")
    if args.variables and (args.command or args.check or args.print_env):
        parser.error("--variables runs no command and no check")
    if not (args.check or args.print_env or args.variables or args.command):
        parser.error("no command given (vmmipc-run [options] -- CMD...)")
    return args


def main(argv):
    args = parse_arguments(argv)
    library, looked_at = paths.find_library(args.lib)
    if args.variables:
        return print_variables(library)
    if args.check:
        return check.check(args, library, looked_at)
    changes = run_environment(args, library or paths.LIBRARY_NAME, os.environ)
    status = settle_options(args, changes, library)
    if status is not None:
        return status
    if library is None:
        print(f"vmmipc-run: {options.library_missing(args.lib, looked_at)}", file=sys.stderr)
        return 1
    dropped = [e for e in split_preload(os.environ.get("LD_PRELOAD"))
               if is_vmmipc(e) and os.path.realpath(e) != os.path.realpath(library)]
    for entry in dropped:
        print(f"vmmipc-run: dropping another {paths.LIBRARY_NAME} from LD_PRELOAD: {entry}",
              file=sys.stderr)
    if args.print_env:
        for name, value in changes.items():
            print(f"export {name}={shlex.quote(value)}")
        if not args.command:
            return 0
    if args.verbose:
        for name, value in changes.items():
            print(f"vmmipc-run: {name}={value}", file=sys.stderr)
        print(f"vmmipc-run: exec {shlex.join(args.command)}", file=sys.stderr)
    env = dict(os.environ)
    env.update(changes)
    try:
        os.execvpe(args.command[0], args.command, env)
    except OSError as error:
        print(f"vmmipc-run: cannot run {args.command[0]}: {error.strerror}", file=sys.stderr)
        return 127


def print_variables(library):
    """--variables: vmmipc-config's table of every variable (docs/configuration.md's)."""
    tool, looked_at = paths.find_tool(library)
    if tool is None:
        print(f"vmmipc-run: {paths.TOOL_NAME} not found (looked at: {', '.join(looked_at)})",
              file=sys.stderr)
        return 1
    try:
        return subprocess.run([tool, "--markdown"], timeout=30).returncode
    except (OSError, subprocess.TimeoutExpired) as error:
        print(f"vmmipc-run: {tool} did not run: {error}", file=sys.stderr)
        return 1


def entry(argv=None):
    """The console script `vmmipc-run` (and scripts/vmmipc-run): exits with main's status."""
    try:
        sys.exit(main(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:  # `vmmipc-run --check | head`
        sys.stderr.close()
        sys.exit(1)


if __name__ == "__main__":
    entry()
