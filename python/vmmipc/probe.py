"""The driver probe of `vmmipc-run --check`: everything the check asks the CUDA driver.

Runs as a script in a child process (vmmipc.check starts it, without libvmmipc.so
preloaded), so that a broken driver cannot take the launcher down: reads
{"library": NAME, "reservations": [[what, base, size], ...]} on stdin and prints a
JSON report on stdout. The driver is loaded with ctypes: nothing is compiled, and no
GPU or driver still gives an answer ("load_error"). Standard library only, and no
import of the vmmipc package (the script's folder is not a package root).
"""

import ctypes
import json
import os
import sys

# CUDA driver API values used by the probe (cuda.h).
CUDA_SUCCESS = 0
ATTR_UNIFIED_ADDRESSING = 41
ATTR_CC_MAJOR = 75
ATTR_CC_MINOR = 76
ATTR_VMM = 102
ATTR_POSIX_FD = 103
ATTR_FABRIC = 128


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


def main():
    request = json.load(sys.stdin)
    reservations = [tuple(r) for r in request["reservations"]]
    json.dump(probe_driver(request["library"], reservations), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
