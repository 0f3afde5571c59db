"""vmmipc-run: run a command with libvmmipc.so preloaded, or check this machine.

  vmmipc-run [options] -- CMD...   prepend libvmmipc.so to LD_PRELOAD, set the
                                   VMMIPC_* variables the options ask for, exec CMD
  vmmipc-run --check               what a user needs to know before a run, and a
                                   VERDICT line (OK / WARN / FAIL)
  vmmipc-run --print-env           the same environment as shell `export` lines

This module is the launcher: `vmmipc-run` is the console script of the Python
package (pip install .) and scripts/vmmipc-run a thin wrapper around it (a
source tree, and cmake --install's bin/). The library is looked for inside this
package (a wheel), else in the install prefix or the source tree around it.

The driver is probed with ctypes on libcuda.so.1 (or VMMIPC_CUDA_LIBRARY) in a
child process, so nothing is compiled and a broken driver cannot take this
script down. No GPU, no driver: the check still runs and says why it fails.
Python 3.8+, standard library only.
"""

import argparse
import ctypes
import json
import os
import re
import resource
import shlex
import socket
import stat
import subprocess
import sys
import sysconfig

VERSION = "0.1.0"  # tests/scripts checks it against project() in CMakeLists.txt

# The library's variables: (name, kind, default), as in csrc/config/params.def
# (tests/scripts/test_vmmipc_run.py fails when the two differ).
PARAMS = [
    ("VMMIPC_ENABLE", "bool", "1"),
    ("VMMIPC_LOG_LEVEL", "level", "warn"),
    ("VMMIPC_LOG_FILE", "string", ""),
    ("VMMIPC_RANK", "int", "-1"),
    ("VMMIPC_RANK_FROM", "string", "auto"),
    ("VMMIPC_HOST_GPUS", "string", ""),
    ("VMMIPC_ZONE_BASE", "size", "0x300000000000"),
    ("VMMIPC_ZONE_FALLBACK_BASE", "size", "0x600000000000"),
    ("VMMIPC_ZONE_SLOTS", "int", "8"),
    ("VMMIPC_SLOT_SIZE", "size", "1T"),
    ("VMMIPC_ZONE_ANCHORS", "bool", "1"),
    ("VMMIPC_TIMEOUT_MS", "int", "5000"),
    ("VMMIPC_SOCKET_DIR", "string", ""),
    ("VMMIPC_CUDA_LIBRARY", "string", "libcuda.so.1"),
    ("VMMIPC_FORCE_POSIX_FD", "bool", "1"),
    ("VMMIPC_ARENA", "bool", "1"),
    ("VMMIPC_ARENA_BASE", "size", "0x200000000000"),
    ("VMMIPC_ARENA_SIZE", "size", "1T"),
    ("VMMIPC_STATS", "bool", "0"),
    ("VMMIPC_EXPORT_FD_CACHE", "int", "1024"),
    ("VMMIPC_EXPORT_ANCHOR", "bool", "1"),
    ("VMMIPC_EXPORT_ON_MAP", "bool", "0"),
    ("VMMIPC_FOLLOW", "bool", "0"),
    ("VMMIPC_LISTENER_THREADS", "int", "4"),
]

LIBRARY_NAME = "libvmmipc.so"
MIB2 = 2 << 20
MAX_RANK = 0xFFFE
RANK_SOURCES = ("auto", "env", "gpu", "off")  # VMMIPC_RANK_FROM
# Where the library reads the host's GPUs when VMMIPC_HOST_GPUS is empty (host_gpus.cc).
PROC_GPU_LIST = "/proc/driver/nvidia/gpus"
SYSFS_GPU_LIST = "/sys/bus/pci/drivers/nvidia"
SUN_PATH_MAX = 107  # bytes of a socket path, without the terminating NUL
USER_ADDRESS_END = 1 << 47  # params.h kUserAddressEnd: no part of the layout reaches past it
DEEPEP_VARIABLE = "DEEPEP_VMMIPC"  # read by python/sitecustomize.py

# CUDA driver API values used by the probe (cuda.h).
CUDA_SUCCESS = 0
CUDA_ERROR_NO_DEVICE = 100
ATTR_UNIFIED_ADDRESSING = 41
ATTR_CC_MAJOR = 75
ATTR_CC_MINOR = 76
ATTR_VMM = 102
ATTR_POSIX_FD = 103
ATTR_FABRIC = 128


# --- The library's configuration, parsed as csrc/config/params.cc does ----------

def _parse_bool(text):
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError("cannot be parsed")


def _parse_int(text):
    value = text.strip()
    if not re.fullmatch(r"[+-]?[0-9]+", value):
        raise ValueError("cannot be parsed")
    number = int(value, 10)
    if not -(1 << 63) <= number < (1 << 63):
        raise ValueError("cannot be parsed")
    return number


def _parse_size(text):
    """Decimal (a leading 0 too, never octal) or 0x hex, optional K/M/G/T[i][B]."""
    value = text.strip()
    match = re.fullmatch(r"(0[xX][0-9a-fA-F]+|[0-9]+)([KMGTkmgt][iI]?[bB]?)?", value)
    if not match:
        raise ValueError("cannot be parsed")
    digits, suffix = match.groups()
    number = int(digits, 16) if digits[:2] in ("0x", "0X") else int(digits, 10)
    shift = {"K": 10, "M": 20, "G": 30, "T": 40}[suffix[0].upper()] if suffix else 0
    number <<= shift
    if number >= 1 << 64:
        raise ValueError("cannot be parsed")
    return number


LEVELS = {"trace": "trace", "debug": "debug", "info": "info", "warn": "warn",
          "warning": "warn", "error": "error", "off": "off", "none": "off"}


def _parse_level(text):
    value = text.strip().lower()
    if value not in LEVELS:
        raise ValueError("cannot be parsed")
    return LEVELS[value]


PARSERS = {"bool": _parse_bool, "int": _parse_int, "size": _parse_size,
           "string": lambda text: text.strip(), "level": _parse_level}


def _range_problem(name, value):
    """The library's checks beyond syntax (params.cc, Invalid()); None when fine."""
    if name == "VMMIPC_ZONE_SLOTS" and not 1 <= value <= MAX_RANK:
        return "must be between 1 and 65534"
    if name in ("VMMIPC_SLOT_SIZE", "VMMIPC_ARENA_SIZE") and (value == 0 or value % MIB2):
        return "must be a positive multiple of 2 MiB"
    if name in ("VMMIPC_ZONE_BASE", "VMMIPC_ZONE_FALLBACK_BASE", "VMMIPC_ARENA_BASE") \
            and value % MIB2:
        return "must be a multiple of 2 MiB"
    if name == "VMMIPC_TIMEOUT_MS" and not 1 <= value <= 3600000:
        return "must be between 1 and 3600000"
    if name == "VMMIPC_RANK" and not -1 <= value <= MAX_RANK:
        return "must be between 0 and 65534 (or -1 for unranked)"
    if name == "VMMIPC_RANK_FROM" and value not in RANK_SOURCES:
        return "must be auto, env, gpu or off"
    if name == "VMMIPC_CUDA_LIBRARY" and not value:
        return "must not be empty"
    return None


def settle_layout(values):
    """The library's layout check (params.cc, SettleLayout), on parsed values in place: the
    zone (slots x slot size) must fit the address space, the zone, fallback zone and arena
    must end below USER_ADDRESS_END and not overlap, the arena must fit a slot. A part that
    does not falls back to its defaults, or is off when they do not fit either. Returns
    (warnings, the parts turned off)."""
    defaults = {name: PARSERS[kind](default) for name, kind, default in PARAMS}
    warnings, off = [], set()
    zone = values["VMMIPC_ZONE_SLOTS"] * values["VMMIPC_SLOT_SIZE"]
    if zone > USER_ADDRESS_END:
        why = "overflows 64 bits" if zone >= 1 << 64 else \
            f"is {human_bytes(zone)}, more than the 47-bit user address space"
        warnings.append(f"VMMIPC_ZONE_SLOTS={values['VMMIPC_ZONE_SLOTS']} and VMMIPC_SLOT_SIZE="
                        f"0x{values['VMMIPC_SLOT_SIZE']:x} are ignored: the import zone (slots x "
                        f"slot size) {why}; the defaults {defaults['VMMIPC_ZONE_SLOTS']} x "
                        f"0x{defaults['VMMIPC_SLOT_SIZE']:x} are used")
        for name in ("VMMIPC_ZONE_SLOTS", "VMMIPC_SLOT_SIZE"):
            values[name] = defaults[name]
        zone = values["VMMIPC_ZONE_SLOTS"] * values["VMMIPC_SLOT_SIZE"]

    def span(what, base, size):
        return f"the {what} [0x{base:x}, +{human_bytes(size)})"

    def past_top(what, base, size):
        if base + size <= USER_ADDRESS_END:
            return None
        return (f"{span(what, base, size)} ends past 0x{USER_ADDRESS_END:x}, the top of the "
                "47-bit user address space")

    def overlap(what, base, size, other, other_base, other_size):
        if other_base and base < other_base + other_size and other_base < base + size:
            return f"{span(what, base, size)} overlaps {span(other, other_base, other_size)}"
        return None

    def settle(part, names, problem, off_name, off_value, off_text):
        why = problem()
        if not why:
            return
        shown = " and ".join(f"{name}=0x{values[name]:x}" for name in names)
        if all(values[name] == defaults[name] for name in names):
            warnings.append(f"{shown} (the default): {why}; {off_text}")
        else:
            for name in names:
                values[name] = defaults[name]
            default_text = " and ".join(f"0x{defaults[name]:x}" for name in names)
            why_default = problem()
            if not why_default:
                warnings.append(f"{shown} is ignored: {why}; the default {default_text} is used")
                return
            warnings.append(f"{shown} is ignored: {why}; the default {default_text} does not "
                            f"fit either ({why_default}); {off_text}")
        values[off_name] = off_value
        off.add(part)

    settle("zone", ["VMMIPC_ZONE_BASE"],
           lambda: values["VMMIPC_ZONE_BASE"] and
           past_top("import zone", values["VMMIPC_ZONE_BASE"], zone),
           "VMMIPC_ZONE_BASE", 0, "no import zone at VMMIPC_ZONE_BASE")
    settle("fallback", ["VMMIPC_ZONE_FALLBACK_BASE"],
           lambda: values["VMMIPC_ZONE_FALLBACK_BASE"] and (
               past_top("fallback zone", values["VMMIPC_ZONE_FALLBACK_BASE"], zone) or
               overlap("fallback zone", values["VMMIPC_ZONE_FALLBACK_BASE"], zone,
                       "import zone", values["VMMIPC_ZONE_BASE"], zone)),
           "VMMIPC_ZONE_FALLBACK_BASE", 0, "no fallback zone")

    def arena_problem():
        base, size = values["VMMIPC_ARENA_BASE"], values["VMMIPC_ARENA_SIZE"]
        if size > values["VMMIPC_SLOT_SIZE"]:
            return (f"the export arena's size {human_bytes(size)} is larger than "
                    f"VMMIPC_SLOT_SIZE ({human_bytes(values['VMMIPC_SLOT_SIZE'])}), so it could "
                    "not mirror into one importer slot")
        return (past_top("export arena", base, size) or
                overlap("export arena", base, size, "import zone", values["VMMIPC_ZONE_BASE"],
                        zone) or
                overlap("export arena", base, size, "fallback zone",
                        values["VMMIPC_ZONE_FALLBACK_BASE"], zone))

    if values["VMMIPC_ARENA"]:
        settle("arena", ["VMMIPC_ARENA_BASE", "VMMIPC_ARENA_SIZE"], arena_problem,
               "VMMIPC_ARENA", False, "export arena off")
    return warnings, off


class Config:
    """The values the library would use in this environment, and why."""

    def __init__(self, env):
        self.values = {}
        self.warnings = []  # one sentence each, as the library's warning lines say
        for name, kind, default in PARAMS:
            parse = PARSERS[kind]
            self.values[name] = parse(default)
            text = env.get(name)
            if text is None:
                continue
            try:
                value = parse(text)
                problem = _range_problem(name, value)
            except ValueError as error:
                problem = str(error)
            if problem:
                self.warnings.append(
                    f"{name}={text!r} is ignored: {problem}; the default {default} is used")
            else:
                self.values[name] = value
        known = {name for name, _, _ in PARAMS}
        for name in sorted(env):
            if name.startswith("VMMIPC_") and name not in known:
                self.warnings.append(f"{name} is not a vmmipc variable (a typo?); it is ignored")
        layout_warnings, self.layout_off = settle_layout(self.values)
        self.warnings.extend(layout_warnings)
        self.rank, self.rank_source, rank_warnings = resolve_rank(
            env, self.values["VMMIPC_RANK"], self.values["VMMIPC_RANK_FROM"])
        self.warnings.extend(rank_warnings)

    def __getitem__(self, name):
        return self.values[name]

    def arena_wanted(self):
        """params.h arena_wanted(): a rank from a variable, or VMMIPC_RANK_FROM=gpu."""
        return bool(self["VMMIPC_ARENA"]) and (self.rank >= 0
                                               or self["VMMIPC_RANK_FROM"] == "gpu")

    def zone_size(self):
        return self["VMMIPC_ZONE_SLOTS"] * self["VMMIPC_SLOT_SIZE"]


def resolve_rank(env, vmmipc_rank, rank_from="auto"):
    """VMMIPC_RANK, else LOCAL_RANK, else RANK: (rank or -1, source, warnings). Under
    VMMIPC_RANK_FROM gpu or off no variable counts."""
    if rank_from in ("gpu", "off"):
        return -1, "none", []
    if vmmipc_rank >= 0:
        return vmmipc_rank, "VMMIPC_RANK", []
    warnings = []
    for name in ("LOCAL_RANK", "RANK"):
        text = env.get(name)
        if text is None:
            continue
        try:
            value = _parse_int(text)
        except ValueError:
            value = -1
        if 0 <= value <= MAX_RANK:
            return value, name, warnings
        warnings.append(f"{name}={text!r} is not a rank between 0 and 65534; it is ignored")
    return -1, "none", warnings


# --- Finding the pieces ----------------------------------------------------------

def package_dir():
    """The folder of this module: the vmmipc package, wherever it is installed."""
    return os.path.dirname(os.path.realpath(__file__))


def _tree_root(directory, *tail):
    """The folder that holds `directory` as root/tail[0]/tail[1]/..., or None."""
    parts = os.path.normpath(directory).split(os.sep)
    if len(parts) <= len(tail) or tuple(parts[-len(tail):]) != tail:
        return None
    return os.sep.join(parts[:-len(tail)]) or os.sep


def library_candidates():
    """Where libvmmipc.so is looked for: inside this package (a wheel), then the
    prefix of a cmake --install tree (share/vmmipc/python/vmmipc), then the build
    folder of a source tree (python/vmmipc)."""
    here = package_dir()
    found = [os.path.join(here, LIBRARY_NAME)]
    prefix = _tree_root(here, "share", "vmmipc", "python", "vmmipc")
    if prefix:
        libdirs = ["lib", "lib64"]
        multiarch = sysconfig.get_config_var("MULTIARCH")
        if multiarch:
            libdirs.append(os.path.join("lib", multiarch))
        found += [os.path.join(prefix, d, LIBRARY_NAME) for d in libdirs]
    root = _tree_root(here, "python", "vmmipc")
    if root:
        build_dir = os.environ.get("BUILD_DIR", "build")  # as scripts/*.sh use it
        found.append(os.path.join(root, build_dir, "csrc", LIBRARY_NAME))
    return found


def find_library(explicit):
    """(absolute path or None, places looked at)."""
    if explicit:
        path = os.path.abspath(explicit)
        return (path if os.path.isfile(path) else None), [path]
    candidates = library_candidates()
    for path in candidates:
        if os.path.isfile(path):
            return os.path.abspath(path), candidates
    return None, candidates


def python_dir():
    """The folder to put on PYTHONPATH for --deepep: the one holding the vmmipc
    sitecustomize hook (with the package beside it in a source or install tree; in a
    wheel the hook is in vmmipc/_site and the package is already importable)."""
    here = package_dir()
    for path in (os.path.join(here, "_site"), os.path.dirname(here)):
        if os.path.isfile(os.path.join(path, "sitecustomize.py")):
            return path
    return None


def split_preload(value):
    # ld.so separates LD_PRELOAD entries with colons or spaces.
    return [entry for entry in re.split(r"[: ]+", value or "") if entry]


def is_vmmipc(entry):
    return os.path.basename(entry) == LIBRARY_NAME


def prepend_preload(current, library):
    """LD_PRELOAD with `library` first, others kept in order, no second vmmipc."""
    kept = [entry for entry in split_preload(current) if not is_vmmipc(entry)]
    return ":".join([library] + kept)


def prepend_path(current, directory):
    entries = [entry for entry in (current or "").split(":") if entry and entry != directory]
    return ":".join([directory] + entries)


# --- Run mode --------------------------------------------------------------------

def run_environment(args, library, env):
    """The environment changes for CMD: {name: value}."""
    changes = {"LD_PRELOAD": prepend_preload(env.get("LD_PRELOAD"), library)}
    if args.rank is not None:
        changes["VMMIPC_RANK"] = str(args.rank)
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
        pydir = python_dir()
        if pydir is None:
            raise SystemExit("vmmipc-run: --deepep: the vmmipc sitecustomize hook is not "
                             "installed beside this package (share/vmmipc/python, "
                             "python/ of a source tree, or vmmipc/_site of a wheel)")
        changes[DEEPEP_VARIABLE] = "1"
        changes["PYTHONPATH"] = prepend_path(env.get("PYTHONPATH"), pydir)
    return changes


def rank_argument(text):
    value = int(text)
    if not 0 <= value <= MAX_RANK:
        raise argparse.ArgumentTypeError("a rank is between 0 and 65534")
    return value


def level_argument(text):
    try:
        return _parse_level(text)
    except ValueError:
        raise argparse.ArgumentTypeError("one of trace, debug, info, warn, error, off")


# --- Check mode: the driver probe (runs in a child process) ------------------------

def probe_driver(library_name, reservations):
    """Everything the check asks the driver; returns a JSON-able dict."""
    out = {"requested": library_name}
    try:
        cuda = ctypes.CDLL(library_name, mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as error:
        out["load_error"] = str(error)
        return out
    out["path"] = _loaded_path(library_name)
    out["simulated"] = hasattr(cuda, "simcuda_get_stats")

    def error_name(code):
        name = ctypes.c_char_p()
        try:
            if cuda.cuGetErrorName(code, ctypes.byref(name)) == CUDA_SUCCESS and name.value:
                return f"{name.value.decode()} ({code})"
        except AttributeError:
            pass
        return f"CUresult {code}"

    def call(function, *arguments):
        try:
            return getattr(cuda, function)(*arguments)
        except AttributeError:
            return None  # an entry point this driver lacks

    code = call("cuInit", 0)
    out["init"] = {"code": code, "name": error_name(code) if code is not None else "missing"}
    if code != CUDA_SUCCESS:
        return out
    version = ctypes.c_int()
    if call("cuDriverGetVersion", ctypes.byref(version)) == CUDA_SUCCESS:
        out["driver_version"] = version.value
    count = ctypes.c_int()
    code = call("cuDeviceGetCount", ctypes.byref(count))
    out["device_count"] = count.value if code == CUDA_SUCCESS else 0
    devices = []
    for ordinal in range(out["device_count"]):
        devices.append(_probe_device(call, ordinal))
    out["devices"] = devices
    out["peer"] = _probe_peers(call, devices)
    if devices:
        out["context"], out["reservations"] = _probe_reservations(call, error_name, devices[0],
                                                                  reservations)
    return out


def _loaded_path(library_name):
    """The file the dynamic loader picked for `library_name` (from /proc/self/maps)."""
    wanted = os.path.basename(library_name)
    stem = wanted.split(".so")[0]
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(None, 5)
                if len(fields) == 6:
                    path = fields[5].strip()
                    if os.path.basename(path).startswith(stem + ".so"):
                        return os.path.realpath(path)
    except OSError:
        pass
    return library_name


def _probe_device(call, ordinal):
    device = ctypes.c_int()
    info = {"ordinal": ordinal}
    if call("cuDeviceGet", ctypes.byref(device), ordinal) != CUDA_SUCCESS:
        info["error"] = "cuDeviceGet failed"
        return info
    info["handle"] = device.value
    name = ctypes.create_string_buffer(256)
    if call("cuDeviceGetName", name, 256, device) == CUDA_SUCCESS:
        info["name"] = name.value.decode(errors="replace")
    total = ctypes.c_size_t()
    if call("cuDeviceTotalMem_v2", ctypes.byref(total), device) == CUDA_SUCCESS:
        info["total_mem"] = total.value
    bus = ctypes.create_string_buffer(64)
    if call("cuDeviceGetPCIBusId", bus, 64, device) == CUDA_SUCCESS:
        info["pci"] = bus.value.decode(errors="replace")
    for key, attribute in (("vmm", ATTR_VMM), ("posix_fd", ATTR_POSIX_FD),
                           ("fabric", ATTR_FABRIC), ("uva", ATTR_UNIFIED_ADDRESSING),
                           ("cc_major", ATTR_CC_MAJOR), ("cc_minor", ATTR_CC_MINOR)):
        value = ctypes.c_int()
        code = call("cuDeviceGetAttribute", ctypes.byref(value), attribute, device)
        info[key] = value.value if code == CUDA_SUCCESS else None
    return info


def _probe_peers(call, devices):
    """{"a-b": 0/1} for every ordered pair of devices, or {} with one device."""
    peers = {}
    for a in devices:
        for b in devices:
            if a is b or "handle" not in a or "handle" not in b:
                continue
            can = ctypes.c_int()
            code = call("cuDeviceCanAccessPeer", ctypes.byref(can), a["handle"], b["handle"])
            peers[f"{a['ordinal']}-{b['ordinal']}"] = can.value if code == CUDA_SUCCESS else None
    return peers


def _probe_reservations(call, error_name, device, reservations):
    """Reserves and frees each (what, base, size) in a context of the first device."""
    context = ctypes.c_void_p()
    code = call("cuDevicePrimaryCtxRetain", ctypes.byref(context), device["handle"])
    context_result = {"code": code, "name": error_name(code) if code is not None else "missing"}
    results = []
    if code != CUDA_SUCCESS:
        return context_result, results
    call("cuCtxSetCurrent", context)
    for what, base, size in reservations:
        got = ctypes.c_ulonglong(0)
        code = call("cuMemAddressReserve", ctypes.byref(got), ctypes.c_size_t(size),
                    ctypes.c_size_t(0), ctypes.c_ulonglong(base), ctypes.c_ulonglong(0))
        result = {"what": what, "base": base, "size": size, "code": code,
                  "name": error_name(code) if code is not None else "missing"}
        if code == CUDA_SUCCESS:
            result["got"] = got.value
            call("cuMemAddressFree", ctypes.c_ulonglong(got.value), ctypes.c_size_t(size))
        results.append(result)
    call("cuCtxSetCurrent", ctypes.c_void_p())
    call("cuDevicePrimaryCtxRelease_v2", device["handle"])
    return context_result, results


def run_probe(library_name, reservations, timeout_s=120):
    """Runs probe_driver in a child Python without vmmipc preloaded."""
    env = dict(os.environ)
    preload = [e for e in split_preload(env.get("LD_PRELOAD")) if not is_vmmipc(e)]
    env["LD_PRELOAD"] = ":".join(preload)
    request = json.dumps({"library": library_name, "reservations": reservations})
    try:
        child = subprocess.run([sys.executable, os.path.realpath(__file__), "--probe-driver"],
                               input=request, capture_output=True, text=True, env=env,
                               timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"requested": library_name,
                "probe_error": f"the driver probe did not finish within {timeout_s} s"}
    if child.returncode != 0:
        why = f"exit status {child.returncode}" if child.returncode > 0 \
            else f"signal {-child.returncode}"
        tail = child.stderr.strip().splitlines()[-1:] or [""]
        return {"requested": library_name,
                "probe_error": f"the driver probe crashed ({why}) {tail[0]}".strip()}
    return json.loads(child.stdout)


# --- Check mode: everything else, and the report -----------------------------------

class Report:
    """Lines of the check, and the reasons behind the verdict."""

    TAGS = {"ok": "ok", "info": "info", "warn": "WARN", "fail": "FAIL"}

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


def human_bytes(size):
    """8 TiB, 512 GiB, 139.8 GiB: whole units when exact, else one decimal; exact bytes
    below 1 KiB. The library's log::Bytes (common/log.cc), so both print the same."""
    if size < 1024:
        return f"{size} bytes"
    units = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
    index = 0
    while index + 1 < len(units) and size >= 1 << (10 * (index + 2)):
        index += 1
    unit = 1 << (10 * (index + 1))
    if size % unit == 0:
        return f"{size // unit} {units[index]}"
    return f"{size / unit:.1f} {units[index]}"


def check_library(report, library, looked_at):
    if library is None:
        report.line("fail", "library", f"{LIBRARY_NAME} not found (looked at: "
                    f"{', '.join(looked_at)}); build it (scripts/setup.sh) or pass --lib",
                    f"{LIBRARY_NAME} not found")
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
                    f"{LIBRARY_NAME} does not load ({message})")
        return
    report.line("ok", "library", f"{library} (loads with LD_PRELOAD)")


def check_driver(report, probe, config):
    """Driver, GPUs, peer access, zone, fallback and arena lines."""
    name = probe.get("requested")
    if "probe_error" in probe:
        report.line("fail", "CUDA driver", f"{name}: {probe['probe_error']}",
                    f"the CUDA driver probe failed ({probe['probe_error']})")
        return
    if "load_error" in probe:
        report.line("fail", "CUDA driver", f"{name} cannot be loaded: {probe['load_error']}",
                    "no CUDA driver (libcuda cannot be loaded; is the NVIDIA driver installed, "
                    "and is this a GPU machine or container started with GPU access?)")
        return
    path = probe.get("path", name)
    init = probe.get("init", {})
    if init.get("code") != CUDA_SUCCESS:
        why = ("no GPU is visible (check CUDA_VISIBLE_DEVICES and the container's GPU access)"
               if init.get("code") == CUDA_ERROR_NO_DEVICE else "the driver did not initialise")
        report.line("fail", "CUDA driver", f"{path}: cuInit failed: {init.get('name')}",
                    f"{why}: cuInit returned {init.get('name')}")
        return
    version = probe.get("driver_version")
    shown = f"CUDA {version // 1000}.{version % 1000 // 10}" if version else "CUDA version unknown"
    if probe.get("simulated"):
        report.line("warn", "CUDA driver", f"{path}, {shown}: vmmipc's SIMULATED driver (host "
                    "memory, for tests), not a GPU", "this is vmmipc's simulated test driver, "
                    "not a GPU driver")
    else:
        report.line("ok", "CUDA driver", f"{path}, {shown}")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = probe.get("devices", [])
    if not devices:
        report.line("fail", "GPUs", "none", "no GPU is visible")
        return
    if visible is not None:
        report.line("info", "GPUs", f"{len(devices)} visible (CUDA_VISIBLE_DEVICES={visible})")
    usable = 0
    for device in devices:
        usable += _device_line(report, device)
    if usable == 0:
        report.line("fail", "GPUs", "no GPU supports VMM memory with POSIX-fd export",
                    "no GPU supports VMM with POSIX-fd export")
    _peer_line(report, probe.get("peer", {}), len(devices))
    _reservation_lines(report, probe, config)


def _device_line(report, device):
    label = f"GPU {device['ordinal']}"
    if "error" in device:
        report.line("warn", label, device["error"], f"{label}: {device['error']}")
        return 0
    cc = f"sm_{device.get('cc_major')}{device.get('cc_minor')}"
    memory = human_bytes(device.get("total_mem", 0)) if device.get("total_mem") else "?"

    def yes(key):
        return {1: "yes", 0: "no", None: "unknown"}.get(device.get(key), "yes")

    text = (f"{device.get('name', '?')}, {cc}, {memory}, PCI {device.get('pci', '?')}: "
            f"VMM {yes('vmm')}, POSIX fd {yes('posix_fd')}, fabric {yes('fabric')}")
    if device.get("vmm") and device.get("posix_fd"):
        report.line("ok", label, text)
        return 1
    missing = "VMM" if not device.get("vmm") else "POSIX-fd export"
    report.line("warn", label, text, f"{label} has no {missing} support: its VMM memory "
                "cannot be shared")
    return 0


def _peer_line(report, peers, count):
    if count < 2:
        report.line("info", "peer access", "one GPU: processes that share it can use IPC; "
                    "peers on other GPUs need peer access")
        return
    missing = sorted(pair for pair, can in peers.items() if not can)
    if missing:
        report.line("warn", "peer access", f"missing between GPUs {', '.join(missing)}",
                    f"no peer access between GPUs {', '.join(missing)} (IPC between them fails, "
                    "as legacy IPC does)")
    else:
        report.line("ok", "peer access", f"every pair of the {count} GPUs")


def _reservation_lines(report, probe, config):
    context = probe.get("context")
    if context is None:
        return
    if context.get("code") != CUDA_SUCCESS:
        report.line("warn", "address space", "not tested: cuDevicePrimaryCtxRetain failed: "
                    f"{context.get('name')}", "the import zone could not be tested")
        return
    results = {r["what"]: r for r in probe.get("reservations", [])}
    slots, slot = config["VMMIPC_ZONE_SLOTS"], config["VMMIPC_SLOT_SIZE"]
    shape = f"{slots} x {human_bytes(slot)}"

    def state(result):
        if result is None:
            return "not tested", False
        if result["code"] != CUDA_SUCCESS:
            return f"cannot be reserved: {result['name']}", False
        if result.get("got") != result["base"]:
            return f"taken (the driver offered 0x{result.get('got', 0):x} instead)", False
        return "free (reserved and released in a fresh process)", True

    zone_text, zone_ok = state(results.get("zone"))
    fallback = results.get("fallback")
    fallback_text, fallback_ok = state(fallback)
    base = config["VMMIPC_ZONE_BASE"]
    if base == 0:
        zone_text = "off: the layout has no room for it (config warning below)"
    if zone_ok:
        report.line("ok", "import zone", f"0x{base:x} + {shape}: {zone_text}")
    elif fallback_ok:
        report.line("warn", "import zone", f"0x{base:x} + {shape}: {zone_text}",
                    f"the import zone 0x{base:x} cannot be had; the fallback "
                    f"0x{fallback['base']:x} is used")
    else:
        report.line("warn", "import zone", f"0x{base:x} + {shape}: {zone_text}",
                    "neither import zone can be reserved: peer memory is placed best-effort "
                    "(works, but peer addresses differ between runs)")
    fallback_base = config["VMMIPC_ZONE_FALLBACK_BASE"]
    if fallback_base == 0 and "fallback" in config.layout_off:
        report.line("info", "fallback zone", "off: the layout has no room for it (config warning "
                    "below)")
    elif fallback_base == 0:
        report.line("info", "fallback zone", "disabled (VMMIPC_ZONE_FALLBACK_BASE=0)")
    else:
        status = "ok" if fallback_ok else "info"
        report.line(status, "fallback zone", f"0x{fallback_base:x} + {shape}: {fallback_text}")
    if not config["VMMIPC_ARENA"]:
        why = "off: the layout has no room for it (config warning below)" \
            if "arena" in config.layout_off else "disabled (VMMIPC_ARENA=0)"
        report.line("info", "export arena", f"{why}: a process's own VMM addresses may differ "
                    "between runs")
        return
    arena_text, arena_ok = state(results.get("arena"))
    arena = f"0x{config['VMMIPC_ARENA_BASE']:x} + {human_bytes(config['VMMIPC_ARENA_SIZE'])}"
    if arena_ok:
        report.line("ok", "export arena", f"{arena}: {arena_text}")
    else:
        report.line("warn", "export arena", f"{arena}: {arena_text}",
                    "the export arena cannot be reserved: an exporter's own addresses (and so "
                    "its peers' addresses) may differ between runs")


def parse_pci(text):
    """(domain, bus, device, function) of '0000:18:00.0' or '00000000:18:00.0'; None else.
    The library's ParsePciAddress (host_gpus.cc)."""
    match = re.fullmatch(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])", text)
    if not match:
        return None
    domain, bus, device, function = (int(part, 16) for part in match.groups())
    return None if device > 0x1F else (domain, bus, device, function)


def host_gpu_list(configured):
    """The host's GPUs in PCI order, as the library reads them: (list, folder, why)."""
    folders = [(configured, False)] if configured else [(PROC_GPU_LIST, False),
                                                        (SYSFS_GPU_LIST, True)]
    whys = []
    for folder, need_class in folders:
        try:
            names = os.listdir(folder)
        except OSError as error:
            whys.append(f"{folder} cannot be read ({error.strerror})")
            continue
        gpus = set()
        for name in names:
            address = parse_pci(name)
            if address is None:
                continue
            if need_class:
                try:
                    with open(os.path.join(folder, name, "class")) as text:
                        if not text.read(4).startswith("0x03"):
                            continue
                except OSError:
                    continue
            gpus.add(address)
        if gpus:
            return sorted(gpus), folder, None
        whys.append(f"{folder} names no GPU")
    return [], None, "; ".join(whys)


def gpu_slots(config, devices):
    """[(ordinal, pci text, slot or None, why)] for the probed devices."""
    gpus, folder, why = host_gpu_list(config["VMMIPC_HOST_GPUS"])
    slots = []
    for device in devices:
        pci = device.get("pci", "")
        address = parse_pci(pci)
        if address is None:
            slots.append((device["ordinal"], pci or "?", None, "the driver gave no PCI address"))
        elif not gpus:
            slots.append((device["ordinal"], pci, None, why))
        elif address not in gpus:
            slots.append((device["ordinal"], pci, None,
                          f"not among the {len(gpus)} GPUs that {folder} lists"))
        else:
            slots.append((device["ordinal"], pci, gpus.index(address), folder))
    return slots


def check_rank(report, config, from_option, devices=()):
    slots = config["VMMIPC_ZONE_SLOTS"]
    if from_option is not None:
        source = "--rank"
    else:
        source = config.rank_source
    rank = config.rank
    rank_from = config["VMMIPC_RANK_FROM"]
    if rank < 0 and rank_from in ("auto", "gpu") and from_option is None:
        found = gpu_slots(config, devices)
        if not found:
            report.line("info", "rank", f"none from a variable; slots from the GPU "
                        f"(VMMIPC_RANK_FROM={rank_from}), but no GPU was probed")
            return
        for ordinal, pci, slot, where in found:
            if slot is None:
                report.line("warn" if rank_from == "gpu" else "info", "rank",
                            f"device {ordinal} ({pci}): no slot from the GPU: {where}; its "
                            "memory is placed best-effort in peers (set VMMIPC_RANK or "
                            "LOCAL_RANK)",
                            f"no rank slot from the GPU for device {ordinal}"
                            if rank_from == "gpu" else None)
            elif slot >= slots:
                report.line("warn", "rank", f"device {ordinal} ({pci}): slot {slot} from the GPU "
                            f"is not below VMMIPC_ZONE_SLOTS={slots}",
                            f"GPU slot {slot} does not fit the {slots} zone slots")
            else:
                arena = ("export arena on" if config.arena_wanted()
                         else "no export arena (VMMIPC_RANK_FROM=gpu turns it on)")
                report.line("ok", "rank", f"device {ordinal} ({pci}): slot {slot} from the GPU "
                            f"(VMMIPC_RANK_FROM={rank_from}: GPU {slot} in PCI order in {where}; "
                            f"no rank variable); {arena}")
        return
    if rank < 0:
        why = (f"VMMIPC_RANK_FROM={rank_from}" if rank_from in ("env", "off")
               else "VMMIPC_RANK, LOCAL_RANK and RANK are unset")
        report.line("info", "rank", f"none here ({why}). "
                    "Normal outside a launcher: torchrun sets LOCAL_RANK per process. A process "
                    "without a rank still shares memory, placed best-effort in its peers")
        return
    if rank >= slots:
        report.line("warn", "rank", f"{rank} (from {source}) is not below VMMIPC_ZONE_SLOTS="
                    f"{slots}: its memory is placed best-effort in peers",
                    f"rank {rank} does not fit the {slots} zone slots")
        return
    note = ""
    if source == "RANK":
        note = " (a global rank: on a multi-node job set LOCAL_RANK or VMMIPC_RANK)"
    report.line("ok", "rank", f"{rank} (from {source}){note}")


def socket_dir_problem(directory, uid):
    """The library's check of a socket directory (socket_address.cc, CheckSocketDir): None
    when it is a directory owned by uid that neither group nor others can write."""
    try:
        info = os.stat(directory)
    except OSError as error:
        return f"cannot be used: {error.strerror}"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    advice = "use a directory of your own that only you can write (mode 0700)"
    if info.st_uid != uid:
        return (f"belongs to uid {info.st_uid}, not to this process's uid {uid}: its owner could "
                f"create or remove socket names in it; {advice}")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = {stat.S_IWGRP | stat.S_IWOTH: "group and others", stat.S_IWOTH: "others",
               stat.S_IWGRP: "its group"}[info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)]
        return (f"is writable by {who} (mode {info.st_mode & 0o7777:04o}): another user could "
                "create socket names in it before vmmipc (the sticky bit does not stop that); "
                f"{advice}")
    return None


def check_sockets(report, config):
    uid = os.geteuid()
    try:
        net = os.readlink("/proc/self/ns/net")
    except OSError:
        net = "unknown"
    directory = config["VMMIPC_SOCKET_DIR"]
    if not directory:
        name = f"vmmipc-check.{uid}.{os.getpid()}"
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as probe:
                probe.bind("\0" + name)
        except OSError as error:
            report.line("fail", "sockets", f"an abstract Unix socket cannot be bound: {error}",
                        f"Unix sockets are not usable ({error})")
            return
        report.line("ok", "sockets", f"abstract (@vmmipc.{uid}.<pid>) in network namespace {net}:"
                    " every rank must share this namespace (containers: --network=host or one "
                    "pod), or set VMMIPC_SOCKET_DIR to a shared directory")
        return
    try:
        with open("/proc/sys/kernel/pid_max") as handle:
            pid_digits = len(handle.read().strip())
    except OSError:
        pid_digits = 7
    longest = os.path.join(directory, f"vmmipc.{uid}.{'9' * pid_digits}.sock")
    problem = socket_dir_problem(directory, uid)
    if not os.path.isdir(directory):
        report.line("fail", "sockets", f"VMMIPC_SOCKET_DIR={directory} is not a directory",
                    f"VMMIPC_SOCKET_DIR {directory} does not exist")
    elif problem:
        report.line("fail", "sockets", f"VMMIPC_SOCKET_DIR={directory} {problem}",
                    f"VMMIPC_SOCKET_DIR {directory} is not private to uid {uid}")
    elif not os.access(directory, os.W_OK | os.X_OK):
        report.line("fail", "sockets", f"VMMIPC_SOCKET_DIR={directory} is not writable by uid "
                    f"{uid}", f"VMMIPC_SOCKET_DIR {directory} is not writable")
    elif len(longest.encode()) > SUN_PATH_MAX:
        report.line("fail", "sockets", f"VMMIPC_SOCKET_DIR={directory} is too long: socket paths "
                    f"would reach {len(longest.encode())} bytes, the limit is {SUN_PATH_MAX}",
                    "VMMIPC_SOCKET_DIR is too long for a socket path")
    else:
        report.line("ok", "sockets", f"files in {directory} (writable; crosses network "
                    f"namespaces; this process is in {net}): every rank must see this directory")


def check_process(report, config):
    uid = os.geteuid()
    report.line("info", "user", f"uid {uid}: ranks share memory only with processes of the same "
                "uid")
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
    if not config["VMMIPC_FORCE_POSIX_FD"]:
        report.line("warn", "config", "VMMIPC_FORCE_POSIX_FD=0: only memory created with POSIX-"
                    "fd export can be shared", "VMMIPC_FORCE_POSIX_FD=0")
    for warning in config.warnings:
        report.line("warn", "config", warning)
    preload = split_preload(os.environ.get("LD_PRELOAD"))
    if preload:
        report.line("info", "LD_PRELOAD", " ".join(preload))


def check(args):
    config = Config(os.environ)
    if args.rank is not None:
        config.rank, config.rank_source = args.rank, "--rank"
    if args.socket_dir is not None:
        config.values["VMMIPC_SOCKET_DIR"] = os.path.abspath(args.socket_dir)
    library, looked_at = find_library(args.lib)
    print(f"vmmipc {VERSION}: vmmipc-run --check")
    report = Report()
    check_library(report, library, looked_at)
    zone = config.zone_size()
    reservations = []
    if config["VMMIPC_ZONE_BASE"]:
        reservations.append(("zone", config["VMMIPC_ZONE_BASE"], zone))
    if config["VMMIPC_ZONE_FALLBACK_BASE"]:
        reservations.append(("fallback", config["VMMIPC_ZONE_FALLBACK_BASE"], zone))
    if config["VMMIPC_ARENA"]:
        reservations.append(("arena", config["VMMIPC_ARENA_BASE"], config["VMMIPC_ARENA_SIZE"]))
    probe = run_probe(config["VMMIPC_CUDA_LIBRARY"], reservations)
    check_driver(report, probe, config)
    check_rank(report, config, args.rank, probe.get("devices", []))
    check_sockets(report, config)
    check_process(report, config)
    return report.verdict()


# --- Command line ----------------------------------------------------------------

def parse_arguments(argv):
    parser = argparse.ArgumentParser(
        prog="vmmipc-run",
        usage="vmmipc-run [options] -- CMD...\n       vmmipc-run --check [options]",
        description="Run CMD with libvmmipc.so preloaded (legacy CUDA IPC on VMM memory), "
                    "or check whether this machine can use it.",
        epilog="Exit status of --check: 0 OK, 2 WARN, 1 FAIL. Every VMMIPC_* variable is in "
               "docs/configuration.md; recipes in docs/recipes.md.")
    parser.add_argument("--check", action="store_true",
                        help="check this machine and print a VERDICT line; runs no command")
    parser.add_argument("--print-env", action="store_true",
                        help="print the environment CMD would get, as shell export lines")
    parser.add_argument("--lib", metavar="PATH",
                        help="libvmmipc.so to preload (default: next to this script's install, "
                             "or $BUILD_DIR/csrc of a source tree)")
    parser.add_argument("--rank", type=rank_argument, metavar="N",
                        help="VMMIPC_RANK=N (one process only: launchers that start several "
                             "ranks set LOCAL_RANK themselves)")
    parser.add_argument("--log-level", type=level_argument, metavar="LEVEL",
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
    parser.add_argument("--probe-driver", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run")
    args = parser.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if args.check and args.command:
        parser.error("--check runs no command")
    if not (args.check or args.print_env or args.probe_driver or args.command):
        parser.error("no command given (vmmipc-run [options] -- CMD...)")
    return args


def main(argv):
    args = parse_arguments(argv)
    if args.probe_driver:
        request = json.load(sys.stdin)
        reservations = [tuple(r) for r in request["reservations"]]
        json.dump(probe_driver(request["library"], reservations), sys.stdout)
        return 0
    if args.check:
        return check(args)
    library, looked_at = find_library(args.lib)
    if library is None:
        print(f"vmmipc-run: {LIBRARY_NAME} not found (looked at: {', '.join(looked_at)}); "
              "build it (scripts/setup.sh) or pass --lib", file=sys.stderr)
        return 1
    dropped = [e for e in split_preload(os.environ.get("LD_PRELOAD"))
               if is_vmmipc(e) and os.path.realpath(e) != os.path.realpath(library)]
    for entry in dropped:
        print(f"vmmipc-run: dropping another {LIBRARY_NAME} from LD_PRELOAD: {entry}",
              file=sys.stderr)
    changes = run_environment(args, library, os.environ)
    socket_dir = changes.get("VMMIPC_SOCKET_DIR")
    if socket_dir and not os.path.isdir(socket_dir):
        print(f"vmmipc-run: warning: --socket-dir {socket_dir} is not a directory: exporters "
              "will not be able to listen (create it, mode 0700)", file=sys.stderr)
    elif socket_dir and socket_dir_problem(socket_dir, os.geteuid()):
        print(f"vmmipc-run: warning: --socket-dir {socket_dir} "
              f"{socket_dir_problem(socket_dir, os.geteuid())}: exporters will not listen and "
              "importers will not connect there", file=sys.stderr)
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


def entry(argv=None):
    """The console script `vmmipc-run` (and scripts/vmmipc-run): exits with main's status."""
    try:
        sys.exit(main(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:  # `vmmipc-run --check | head`
        sys.stderr.close()
        sys.exit(1)


if __name__ == "__main__":  # the driver probe's child runs this file as a script
    entry()
