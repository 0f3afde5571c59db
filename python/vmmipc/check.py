"""`vmmipc-run --check`: what a user needs to know before a run, and a VERDICT line.

The configuration, the rank, the slots from the GPU and the socket verdict are
vmmipc-config's (vmmipc.settled); the driver is asked by a child process
(vmmipc.probe, vmmipc.check_driver). This module words them as report lines.
"""

import os
import resource
import shlex
import subprocess
import sys

import vmmipc
from vmmipc import check_driver, options, paths
from vmmipc.preload import split_preload
from vmmipc.settled import ToolError, settle


class Report:
    """Lines of the check, and the reasons behind the verdict."""

    TAGS = {"ok": "ok", "info": "info", "warn": "WARN", "fail": "FAIL", "next": "next"}

    def __init__(self):
        self.failures = []
        self.warnings = []

    def line(self, status, topic, text, reason=None):
        print(f"[{self.TAGS[status]:>4}] {topic:<15} {text}")
        if status == "fail":
            self.failures.append(reason or text)
        elif status == "warn":
            self.warnings.append(reason or text)

    def verdict(self):
        if self.failures:
            also = f" (and {len(self.warnings)} warnings above)" if self.warnings else ""
            print("VERDICT: FAIL: cannot share memory here: " + "; ".join(self.failures) + also)
            return 1
        if self.warnings:
            print("VERDICT: WARN: sharing should work, but: " + "; ".join(self.warnings))
            return 2
        print("VERDICT: OK: vmmipc can share VMM memory between the processes of this machine")
        return 0


def check_library(report, library, looked_at):
    name = paths.LIBRARY_NAME
    if library is None:
        report.line("fail", "library", options.library_missing(None, looked_at),
                    f"{name} not found")
        return
    with open(library, "rb") as handle:
        head = handle.read(5)
    if head[:4] != b"\x7fELF" or head[4:5] != b"\x02":
        report.line("fail", "library", f"{library} is not a 64-bit ELF shared object",
                    f"{library} is not a shared library")
        return
    probe = "/bin/true" if os.access("/bin/true", os.X_OK) else sys.executable
    args = [probe] if probe == "/bin/true" else [probe, "-c", "pass"]
    env = dict(os.environ, LD_PRELOAD=library)
    child = subprocess.run(args, env=env, capture_output=True, text=True)
    if "cannot be preloaded" in child.stderr or "error while loading" in child.stderr:
        message = child.stderr.strip().splitlines()[0]
        report.line("fail", "library", f"{library} does not load: {message}",
                    f"{name} does not load ({message})")
        return
    report.line("ok", "library", f"{library} (loads with LD_PRELOAD)")


def _gpu_slot_lines(report, config, devices, env, library):
    """One line per probed device: the slot its index among the host's GPUs gives."""
    rank_from = config["VMMIPC_RANK_FROM"]
    addressed = [device for device in devices if device.get("pci")]
    try:
        gpus = settle(env, [d["pci"] for d in addressed], library).gpus if addressed else []
    except ToolError as error:
        report.line("warn", "rank", f"slots from the GPU not known: {error}",
                    "the slots from the GPU could not be asked")
        return
    answers = {device["ordinal"]: gpu for device, gpu in zip(addressed, gpus)}
    slots = config["VMMIPC_ZONE_SLOTS"]
    for device in devices:
        ordinal, gpu = device["ordinal"], answers.get(device["ordinal"])
        pci = device.get("pci") or "?"
        if gpu is None or gpu["slot"] is None:
            why = gpu["why_not"] if gpu else "the driver gave no PCI address"
            report.line("warn" if rank_from == "gpu" else "info", "rank",
                        f"device {ordinal} ({pci}): no slot from the GPU: {why}; its memory is "
                        "placed best-effort in peers (set VMMIPC_RANK or LOCAL_RANK)",
                        f"no rank slot from the GPU for device {ordinal}"
                        if rank_from == "gpu" else None)
        elif not gpu["fits_zone"]:
            report.line("warn", "rank", f"device {ordinal} ({pci}): slot {gpu['slot']} from the "
                        f"GPU is not below VMMIPC_ZONE_SLOTS={slots}",
                        f"GPU slot {gpu['slot']} does not fit the {slots} zone slots")
        else:
            arena = ("export arena on" if config.rank_info["arena_wanted"]
                     else "no export arena (VMMIPC_RANK_FROM=gpu turns it on)")
            report.line("ok", "rank", f"device {ordinal} ({pci}): slot {gpu['slot']} from the GPU "
                        f"(VMMIPC_RANK_FROM={rank_from}: GPU {gpu['index']} in PCI order in "
                        f"{gpu['list']}; no rank variable); {arena}")


def check_rank(report, config, from_option, devices, env, library):
    slots = config["VMMIPC_ZONE_SLOTS"]
    rank, rank_from = config.rank, config["VMMIPC_RANK_FROM"]
    source = "--rank" if from_option and config.rank_source == "VMMIPC_RANK" \
        else config.rank_source
    if config.rank_info["slot_from_gpu"]:
        if not devices:
            report.line("info", "rank", f"none from a variable; slots from the GPU "
                        f"(VMMIPC_RANK_FROM={rank_from}), but no GPU was probed")
            return
        _gpu_slot_lines(report, config, devices, env, library)
        return
    if rank < 0:
        why = (f"VMMIPC_RANK_FROM={rank_from}" if rank_from in ("env", "off")
               else "VMMIPC_RANK, LOCAL_RANK and RANK are unset")
        report.line("info", "rank", f"none here ({why}). "
                    "Normal outside a launcher: torchrun sets LOCAL_RANK per process. A process "
                    "without a rank still shares memory, placed best-effort in its peers")
        return
    if not config.rank_info["fits_zone"]:
        report.line("warn", "rank", f"{rank} (from {source}) is not below VMMIPC_ZONE_SLOTS="
                    f"{slots}: its memory is placed best-effort in peers",
                    f"rank {rank} does not fit the {slots} zone slots")
        return
    note = ""
    if source == "RANK":
        note = " (a global rank: on a multi-node job set LOCAL_RANK or VMMIPC_RANK)"
    report.line("ok", "rank", f"{rank} (from {source}){note}")


# The verdict's reason for each problem vmmipc-config finds with VMMIPC_SOCKET_DIR.
SOCKET_DIR_REASONS = {
    "missing": "VMMIPC_SOCKET_DIR {dir} does not exist",
    "not_directory": "VMMIPC_SOCKET_DIR {dir} is not a directory",
    "not_private": "VMMIPC_SOCKET_DIR {dir} is not private to uid {uid}",
    "not_writable": "VMMIPC_SOCKET_DIR {dir} is not writable",
    "too_long": "VMMIPC_SOCKET_DIR is too long for a socket path",
}


def check_sockets(report, config):
    sockets = config.sockets
    net = sockets["network_namespace"]
    if sockets.get("problem") == "overflow_uid":
        # An unmapped user namespace: vmmipc neither serves nor imports here.
        report.line("fail", "sockets", sockets["why"],
                    f"uid {sockets['uid']} is the overflow uid (a user namespace without a "
                    "uid mapping)")
        return
    if sockets["kind"] == "abstract":
        if not sockets["usable"]:
            report.line("fail", "sockets", sockets["why"],
                        f"Unix sockets are not usable ({sockets['why']})")
            return
        report.line("ok", "sockets", f"abstract ({sockets['pattern']}) in network namespace "
                    f"{net}: only processes in this network namespace reach these names "
                    "(containers: --network=host, or one pod); for a peer in another one set "
                    "VMMIPC_SOCKET_DIR to a directory every rank mounts")
        return
    directory = sockets["dir"]
    if sockets["usable"]:
        report.line("ok", "sockets", f"files in {directory} (writable; crosses network "
                    f"namespaces; this process is in {net}): every rank must see this directory")
        return
    problem = sockets["problem"]
    lead = "is too long: " if problem == "too_long" else ""
    reason = SOCKET_DIR_REASONS.get(problem, "VMMIPC_SOCKET_DIR {dir} cannot be used")
    report.line("fail", "sockets", f"VMMIPC_SOCKET_DIR={directory} {lead}{sockets['why']}",
                reason.format(dir=directory, uid=sockets["uid"]))


def check_process(report, config):
    uid = os.geteuid()
    host_uid = config.sockets.get("name_uid", uid)
    if host_uid != uid:
        # A user namespace (rootless container): "the same uid" is the host's.
        report.line("info", "user", f"uid {uid} in a user namespace, uid {host_uid} outside it: "
                    f"ranks share memory only with processes that are uid {host_uid} outside "
                    "(the host's processes of that user, or this namespace's)")
    else:
        report.line("info", "user", f"uid {uid}: ranks share memory only with processes of the "
                    "same uid")
    report.line("info", "ptrace", "not needed, by design: fds travel over a Unix socket "
                "(SCM_RIGHTS); no ptrace, pidfd_getfd, CAP_SYS_PTRACE or /proc/<pid>/fd access")
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < 256:
        report.line("warn", "open files", f"soft limit {soft}: an open holds one fd per chunk "
                    "of the run while it maps; raise it (ulimit -n)", f"open-file limit {soft}")
    else:
        shown = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
        report.line("info", "open files", f"soft limit {shown}: an open holds one fd per chunk "
                    "of the run at once (PyTorch maps 20 MiB chunks)")
    if not config["VMMIPC_ENABLE"]:
        report.line("warn", "config", "VMMIPC_ENABLE=0: every hook passes through to the driver",
                    "VMMIPC_ENABLE=0 turns vmmipc off")
    if config["VMMIPC_FOLLOW"]:
        report.line("info", "follow", "on (the default): importers follow a memory saver's pause "
                    "and resume; an exporter says once, at its first unmap of such memory, when an "
                    "importer of it does not follow (VMMIPC_STATS: unfollowed_unmaps)")
    else:
        report.line("warn", "follow", "VMMIPC_FOLLOW=0: legacy IPC's semantics: memory this "
                    "process opens stays allocated when its exporter frees it and a memory saver's "
                    "resume is not seen here; importers of its memory are not told of its frees",
                    "VMMIPC_FOLLOW=0 (a memory saver's peers keep the old memory)")
    if config["VMMIPC_AHEAD"]:
        report.line("info", "ahead", "VMMIPC_AHEAD=1: announced handles are mapped ahead of "
                    "the application's opens (set it in every process)")
    if not config["VMMIPC_FORCE_POSIX_FD"]:
        report.line("warn", "config", "VMMIPC_FORCE_POSIX_FD=0: only memory created with POSIX-"
                    "fd export can be shared", "VMMIPC_FORCE_POSIX_FD=0")
    for warning in config.warnings:  # unknown VMMIPC_* names too, as the library warns
        report.line("warn", "config", warning)
    check_log_file(report, config)
    preload = split_preload(os.environ.get("LD_PRELOAD"))
    if preload:
        report.line("info", "LD_PRELOAD", " ".join(preload))


def check_log_file(report, config):
    """VMMIPC_LOG_FILE as the library would open it (judged by vmmipc-config, which
    creates nothing): where the lines go, or the warning it would print instead."""
    log_file = config.document["log_file"]
    pattern = log_file["pattern"]
    if not pattern:
        return
    if not log_file["usable"]:
        report.line("warn", "log file", log_file["problem"],
                    "VMMIPC_LOG_FILE cannot be used (lines would go to stderr)")
        return
    here = f" ({log_file['path']} for this process)" if log_file["path"] != pattern else ""
    report.line("ok", "log file", f"lines go to {pattern}{here}")


# Where drivers are installed that the loader may not search: distributions' library
# folders, NVIDIA's container toolkit, WSL, the GPU operator's driver container. Never the
# toolkit's stubs/ (a libcuda.so that only links).
DRIVER_FOLDERS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
                  "/usr/lib", "/usr/local/nvidia/lib64", "/usr/local/nvidia/lib",
                  "/usr/lib/wsl/lib", "/run/nvidia/driver/usr/lib64",
                  "/run/nvidia/driver/usr/lib/x86_64-linux-gnu")


def drivers_found(folders=DRIVER_FOLDERS, name="libcuda.so.1"):
    """The files called `name` in `folders` (the loader may not search them)."""
    return [os.path.join(folder, name) for folder in folders
            if os.path.isfile(os.path.join(folder, name))]


def demo_command():
    """How to run the demo on the simulated driver from this installation, or None: the
    source tree's scripts/demo.sh (it builds what it needs), else the wheel's
    `python -m vmmipc demo` (its simulator in vmmipc/_sim)."""
    root = paths.source_root()
    if root:
        return os.path.join(root, "scripts", "demo.sh")
    if paths.simulator():
        return f"{shlex.quote(sys.executable)} -m vmmipc demo"
    return None


def next_steps(report, missing, requested, folders=DRIVER_FOLDERS):
    """After a check without a driver (check_driver.NO_DRIVER) or without a GPU (NO_GPU):
    how to point vmmipc at a driver, and how to try it without a GPU."""
    if missing == check_driver.NO_DRIVER:
        found = drivers_found(folders, os.path.basename(requested or "libcuda.so.1"))
        if found:
            folder = os.path.dirname(found[0])
            report.line("next", "driver", f"{found[0]} exists but was not loaded: "
                        f"LD_LIBRARY_PATH={folder} vmmipc-run --check, or "
                        f"VMMIPC_CUDA_LIBRARY={found[0]}")
        else:
            report.line("next", "driver", "on a GPU machine, name the driver's folder "
                        "(LD_LIBRARY_PATH=/path/to/driver/lib vmmipc-run --check) or its file "
                        "(VMMIPC_CUDA_LIBRARY=/path/to/libcuda.so.1); in a container, start it "
                        "with GPU access (docker run --gpus all)")
    demo = demo_command()
    if demo:
        report.line("next", "try it", f"without a GPU, on vmmipc's simulated driver: {demo}")
    else:
        report.line("next", "try it", "without a GPU, on vmmipc's simulated driver: from the "
                    "wheel (pip install vmmipc; python -m vmmipc demo) or a source tree "
                    "(scripts/demo.sh)")


def check(args, library, looked_at):
    """The whole check; returns the exit status (0 OK, 2 WARN, 1 FAIL)."""
    env = dict(os.environ)
    if args.rank is not None:
        env["VMMIPC_RANK"] = args.rank
    if args.socket_dir is not None:
        env["VMMIPC_SOCKET_DIR"] = os.path.abspath(args.socket_dir)
    if args.log_file is not None:
        env["VMMIPC_LOG_FILE"] = os.path.abspath(args.log_file)
    try:
        config, missing = settle(env, library=library), None
    except ToolError as error:
        config, missing = None, error
    problem = config and args.rank is not None and options.first_refused(
        {"VMMIPC_RANK": args.rank}, config)
    if problem:
        # As in run mode: a --rank the library would refuse is a usage error.
        print(f"vmmipc-run: error: {problem}", file=sys.stderr)
        return 2
    print(f"vmmipc {vmmipc.__version__}: vmmipc-run --check")
    report = Report()
    check_library(report, library, looked_at)
    if missing is not None:
        report.line("fail", "config", f"{missing}; reinstall vmmipc, or build it "
                    "(scripts/setup.sh)", f"the configuration cannot be read ({missing})")
        return report.verdict()
    probe = check_driver.run_probe(config["VMMIPC_CUDA_LIBRARY"],
                                   check_driver.reservations(config))
    missing = check_driver.check_driver(report, probe, config)
    check_rank(report, config, args.rank is not None, probe.get("devices", []), env, library)
    check_sockets(report, config)
    check_process(report, config)
    if missing:
        next_steps(report, missing, probe.get("requested"))
    return report.verdict()
