"""`vmmipc-run --check`: the driver probe's results as report lines (driver, GPUs, peer
access, and whether the import zone, the fallback zone and the export arena can be
reserved at the addresses vmmipc-config settled)."""

import json
import os
import subprocess
import sys

from vmmipc import probe
from vmmipc.preload import without_vmmipc

CUDA_SUCCESS = 0
CUDA_ERROR_NO_DEVICE = 100
NO_ROOM = "off: the layout has no room for it (config warning below)"


def reservations(config):
    """The (what, base, size) the probe tries to reserve: the parts of the settled layout
    that are on."""
    layout = config.layout
    found = []
    for what in ("zone", "fallback", "arena"):
        if layout[what]["on"]:
            found.append((what, layout[what]["base"], layout[what]["size"]))
    return found


def run_probe(library_name, reservations, timeout_s=120):
    """Runs the probe (vmmipc/probe.py) in a child Python without vmmipc preloaded."""
    env = without_vmmipc(os.environ)
    request = json.dumps({"library": library_name, "reservations": reservations})
    try:
        child = subprocess.run([sys.executable, probe.__file__],
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


# What check_driver found missing, for --check's next steps (vmmipc.check.next_steps).
NO_DRIVER = "no driver"
NO_GPU = "no GPU"


def check_driver(report, probe, config):
    """Driver, GPUs, peer access, zone, fallback and arena lines. Returns NO_DRIVER when
    libcuda cannot be loaded, NO_GPU when it has no device, else None."""
    name = probe.get("requested")
    if "probe_error" in probe:
        report.line("fail", "CUDA driver", f"{name}: {probe['probe_error']}",
                    f"the CUDA driver probe failed ({probe['probe_error']})")
        return None
    if "load_error" in probe:
        report.line("fail", "CUDA driver", f"{name} cannot be loaded: {probe['load_error']}",
                    "no CUDA driver (libcuda cannot be loaded; is the NVIDIA driver installed, "
                    "and is this a GPU machine or container started with GPU access?)")
        return NO_DRIVER
    path = probe.get("path", name)
    init = probe.get("init", {})
    if init.get("code") != CUDA_SUCCESS:
        no_device = init.get("code") == CUDA_ERROR_NO_DEVICE
        why = ("no GPU is visible (check CUDA_VISIBLE_DEVICES and the container's GPU access)"
               if no_device else "the driver did not initialise")
        report.line("fail", "CUDA driver", f"{path}: cuInit failed: {init.get('name')}",
                    f"{why}: cuInit returned {init.get('name')}")
        return NO_GPU if no_device else None
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
        return NO_GPU
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
    return None


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
        zone_text = NO_ROOM if config.layout["zone"]["no_room"] else "disabled (VMMIPC_ZONE_BASE=0)"
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
    if fallback_base == 0 and config.layout["fallback"]["no_room"]:
        report.line("info", "fallback zone", NO_ROOM)
    elif fallback_base == 0:
        report.line("info", "fallback zone", "disabled (VMMIPC_ZONE_FALLBACK_BASE=0)")
    else:
        status = "ok" if fallback_ok else "info"
        report.line(status, "fallback zone", f"0x{fallback_base:x} + {shape}: {fallback_text}")
    if not config["VMMIPC_ARENA"]:
        why = NO_ROOM if config.layout["arena"]["no_room"] else "disabled (VMMIPC_ARENA=0)"
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
