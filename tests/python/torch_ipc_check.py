#!/usr/bin/env python3
"""torch_ipc_check: legacy CUDA IPC on PyTorch expandable-segment (VMM) memory, through vmmipc.

Run with LD_PRELOAD=/path/to/libvmmipc.so (scripts/gpu-check.sh does). One file, re-executed in
fresh processes for each role:
  main (default)   checks the prerequisites, runs the exporter --exporter-runs times (and the
                   baseline when GPU_CHECK_BASELINE=1), compares pointers across exporter runs,
                   prints the summary and sets the exit code.
  exporter         VMMIPC_RANK=0, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: torch
                   allocates tensors A and B (B lies inside the same segment), fills patterns,
                   takes legacy handles with cuda.bindings (and CuPy), runs each importer twice,
                   verifies their replies and compares their pointers.
  importer-driver  VMMIPC_RANK=1: cuda.bindings.driver.cuIpcOpenMemHandle, checks the bytes,
                   writes a reply, closes (plus open-twice and one-close-too-many).
  importer-cupy    VMMIPC_RANK=1: the same through cupy.cuda.runtime.ipcOpenMemHandle.
  baseline         without vmmipc: cuIpcGetMemHandle on the VMM tensor must fail with
                   CUDA_ERROR_INVALID_VALUE (docs/driver-behaviour.md).
Each check prints `CHECK <name> PASS|FAIL|SKIP <detail>`. Exit: 1 if any FAIL; the skip code
(--skip-exit-code, default 0) when nothing could run (no torch / cuda.bindings / GPU); else 0.
--fake-gpu runs the same plumbing on host memory (no CUDA at all): a test of this script only.
"""

import argparse
import importlib.util
import json
import mmap
import os
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback

MIB = 1 << 20
# A is not a multiple of 2 MiB, so B (allocated next, in the same expandable segment) starts at an
# unaligned interior address and crosses a 20 MiB chunk boundary of PyTorch's segment.
A_BYTES = 64 * MIB + 12 * 1024
B_BYTES = 24 * MIB
SEED_A = 11
SEED_B = 12
STILL_MAPPED_WINDOW = 64 * 1024

CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_INVALID_CONTEXT = 201
CALL_RAISED = -1  # a binding raised instead of returning a CUresult

INTERNAL_SKIP = 77  # an exporter or importer that could not run at all
IMPORTER_KINDS = ("driver", "cupy")
FAKE_DIR_ENV = "TORCH_CHECK_FAKE_DIR"
FAKE_BREAK_ENV = "TORCH_CHECK_FAKE_BREAK"  # testing this script: inject one fault
FAKE_EXPORT_BASE = 0x7E0000000000
FAKE_IMPORT_BASE = 0x300000000000
FAKE_CHUNK = 20 * MIB


# --- output -----------------------------------------------------------------------------------


def emit(name, status, detail=""):
    """Prints one CHECK line on stdout (the only thing parents parse)."""
    text = " ".join(str(detail).split())  # one line, whatever the detail holds
    print(f"CHECK {name} {status} {text}".rstrip(), flush=True)


def log(role, message):
    # One write per line: stderr is write-through, and print() would write the newline apart,
    # letting other processes' lines land in between.
    sys.stderr.write(f"[{role} pid {os.getpid()}] {message}\n")
    sys.stderr.flush()


def hexptr(value):
    return "None" if value is None else hex(value)


# --- patterns ---------------------------------------------------------------------------------

_TABLE = bytes(range(256)) * 2
_BLOCK = 4096


def pattern(seed, start, length):
    """The bytes of pattern `seed` at absolute offsets [start, start + length).

    Each 4 KiB block is 0..255 rotated by an amount that depends on the block index and the seed,
    so a read from a wrong offset or a wrong buffer does not match.
    """
    first = start // _BLOCK
    last = (start + length + _BLOCK - 1) // _BLOCK
    parts = []
    for k in range(first, last):
        r = (k * 37 + seed * 101 + (k >> 8) * 11) & 0xFF
        parts.append(_TABLE[r:r + 256] * (_BLOCK // 256))
    blob = b"".join(parts)
    skip = start - first * _BLOCK
    return blob[skip:skip + length]


def describe_diff(got, want, offset=0):
    """None when equal, else where and how `got` differs from `want`."""
    if got == want:
        return None
    if len(got) != len(want):
        return f"length {len(got)} != expected {len(want)}"
    step = 1 << 16
    first = None
    bad_blocks = 0
    for i in range(0, len(want), step):
        if got[i:i + step] != want[i:i + step]:
            bad_blocks += 1
            if first is None:
                first = next(j for j in range(i, min(i + step, len(want))) if got[j] != want[j])
    blocks = (len(want) + step - 1) // step
    zeros = " (zeros there)" if not any(got[first:first + 64]) else ""
    return (f"first difference at byte offset {hex(offset + first)}: expected "
            f"{want[first]:#04x} got {got[first]:#04x}{zeros}; {bad_blocks} of {blocks} 64 KiB "
            f"blocks differ")


def handle_bytes(reserved):
    """The 64 bytes of a CUipcMemHandle.reserved, whatever type the bindings give."""
    if isinstance(reserved, (bytes, bytearray, memoryview)):
        raw = bytes(reserved)
    elif isinstance(reserved, str):
        raw = reserved.encode("latin-1")
    else:
        raw = bytes(int(x) & 0xFF for x in reserved)
    if len(raw) != 64:
        raise ValueError(f"handle has {len(raw)} bytes, expected 64")
    return raw


def vmmipc_mapped():
    """True when libvmmipc is mapped into this process (the preload took effect)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return any("libvmmipc" in line for line in maps)
    except OSError:
        return False


def env_without_vmmipc(env):
    """A copy of `env` whose LD_PRELOAD no longer names libvmmipc (other preloads are kept)."""
    out = dict(env)
    kept = [p for p in out.get("LD_PRELOAD", "").replace(":", " ").split()
            if "vmmipc" not in p]
    if kept:
        out["LD_PRELOAD"] = " ".join(kept)
    else:
        out.pop("LD_PRELOAD", None)
    return out


# --- the CUDA driver through cuda.bindings ----------------------------------------------------


def load_driver_module():
    """cuda.bindings.driver (cuda-python >= 12.6), else the older `from cuda import cuda`."""
    try:
        from cuda.bindings import driver  # pylint: disable=import-outside-toplevel
        return driver
    except ImportError:
        from cuda import cuda as driver  # pylint: disable=import-outside-toplevel
        return driver


def bindings_version():
    try:
        import cuda.bindings  # pylint: disable=import-outside-toplevel
        return getattr(cuda.bindings, "__version__", "?")
    except ImportError:
        try:
            import cuda  # pylint: disable=import-outside-toplevel
            return "cuda-python " + getattr(cuda, "__version__", "?")
        except ImportError:
            return "missing"


class Driver:
    """cuda.bindings.driver with every call as (err, value, err_name); never raises."""

    def __init__(self):
        self.drv = load_driver_module()
        self.lazy_flag = int(self.drv.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)

    def name(self, err):
        if err == CALL_RAISED:
            return "raised"
        try:
            return f"{self.drv.CUresult(err).name}({err})"
        except Exception:  # pylint: disable=broad-except
            return f"CUresult({err})"

    def call(self, fn, *args):
        try:
            out = getattr(self.drv, fn)(*args)
        except Exception as exc:  # pylint: disable=broad-except
            return CALL_RAISED, None, f"{fn} raised {type(exc).__name__}: {exc}"
        if not isinstance(out, tuple):
            out = (out,)
        err = int(out[0])
        values = out[1:]
        value = values[0] if len(values) == 1 else (values if values else None)
        return err, value, self.name(err)

    def ptr(self, value):
        return self.drv.CUdeviceptr(int(value))

    def make_context_current(self, device):
        """Retains the device's primary context and makes it current; returns '' or the error."""
        for step in ("cuInit",):
            err, _, name = self.call(step, 0)
            if err:
                return f"{step}: {name}"
        err, dev, name = self.call("cuDeviceGet", device)
        if err:
            return f"cuDeviceGet: {name}"
        err, ctx, name = self.call("cuDevicePrimaryCtxRetain", dev)
        if err:
            return f"cuDevicePrimaryCtxRetain: {name}"
        err, _, name = self.call("cuCtxSetCurrent", ctx)
        return f"cuCtxSetCurrent: {name}" if err else ""

    def get_handle(self, ptr):
        err, handle, name = self.call("cuIpcGetMemHandle", self.ptr(ptr))
        if err:
            return err, None, name
        try:
            return err, handle_bytes(handle.reserved), name
        except Exception as exc:  # pylint: disable=broad-except
            return CALL_RAISED, None, f"reading CUipcMemHandle.reserved: {exc}"

    def open_handle(self, raw):
        try:
            handle = self.drv.CUipcMemHandle()
            handle.reserved = raw
        except Exception as exc:  # pylint: disable=broad-except
            return CALL_RAISED, None, f"building CUipcMemHandle: {exc}"
        err, ptr, name = self.call("cuIpcOpenMemHandle", handle, self.lazy_flag)
        return err, (int(ptr) if not err else None), name

    def close_handle(self, ptr):
        err, _, name = self.call("cuIpcCloseMemHandle", self.ptr(ptr))
        return err, name

    def read(self, ptr, length):
        buf = bytearray(length)
        err, _, name = self.call("cuMemcpyDtoH", buf, self.ptr(ptr), length)
        if err:
            raise RuntimeError(f"cuMemcpyDtoH({hex(ptr)}, {length}): {name}")
        return bytes(buf)

    def write(self, ptr, data):
        err, _, name = self.call("cuMemcpyHtoD", self.ptr(ptr), data, len(data))
        if err:
            raise RuntimeError(f"cuMemcpyHtoD({hex(ptr)}, {len(data)}): {name}")

    def sync(self):
        err, _, name = self.call("cuCtxSynchronize")
        return err, name

    def attribute(self, attr_name, ptr):
        attr = getattr(self.drv.CUpointer_attribute, attr_name)
        err, value, name = self.call("cuPointerGetAttribute", attr, self.ptr(ptr))
        return err, (int(value) if not err else None), name

    def address_range(self, ptr):
        err, value, name = self.call("cuMemGetAddressRange", self.ptr(ptr))
        if err:
            return err, None, name
        base, size = value
        return err, (int(base), int(size)), name

    def is_vmm(self, ptr):
        """cuMemRetainAllocationHandle succeeds only on VMM memory (docs/driver-behaviour.md)."""
        err, handle, name = self.call("cuMemRetainAllocationHandle", int(ptr))
        if err:
            return False, f"cuMemRetainAllocationHandle: {name}"
        self.call("cuMemRelease", handle)
        return True, "cuMemRetainAllocationHandle succeeded: VMM memory"


# --- importers: cuda.bindings, CuPy, fake -----------------------------------------------------


class DriverImporter:
    label = "cuda.bindings.driver.cuIpcOpenMemHandle"

    def __init__(self, device):
        self.cu = Driver()
        error = self.cu.make_context_current(device)
        if error:
            raise RuntimeError(error)

    def open(self, raw):
        return self.cu.open_handle(raw)

    def close(self, ptr):
        return self.cu.close_handle(ptr)

    def read(self, ptr, length):
        return self.cu.read(ptr, length)

    def write(self, ptr, data):
        self.cu.write(ptr, data)

    def sync(self):
        return self.cu.sync()


class CupyImporter:
    label = "cupy.cuda.runtime.ipcOpenMemHandle"

    def __init__(self, device):
        import cupy  # pylint: disable=import-outside-toplevel
        import numpy  # pylint: disable=import-outside-toplevel
        self.cupy = cupy
        self.numpy = numpy
        self.device = device
        self.rt = cupy.cuda.runtime
        cupy.cuda.Device(device).use()

    def _err(self, exc):
        status = getattr(exc, "status", None)
        return (int(status) if status is not None else CALL_RAISED), f"{type(exc).__name__}: {exc}"

    def open(self, raw):
        try:
            ptr = self.rt.ipcOpenMemHandle(bytes(raw), self.rt.cudaIpcMemLazyEnablePeerAccess)
            return CUDA_SUCCESS, int(ptr), "cudaSuccess"
        except Exception as exc:  # pylint: disable=broad-except
            err, name = self._err(exc)
            return err, None, name

    def close(self, ptr):
        try:
            self.rt.ipcCloseMemHandle(ptr)
            return CUDA_SUCCESS, "cudaSuccess"
        except Exception as exc:  # pylint: disable=broad-except
            return self._err(exc)

    def _array(self, ptr, length):
        mem = self.cupy.cuda.UnownedMemory(ptr, length, self, self.device)
        return self.cupy.ndarray((length,), dtype=self.cupy.uint8,
                                 memptr=self.cupy.cuda.MemoryPointer(mem, 0))

    def read(self, ptr, length):
        return self._array(ptr, length).get().tobytes()

    def write(self, ptr, data):
        self._array(ptr, len(data)).set(self.numpy.frombuffer(data, dtype=self.numpy.uint8))

    def sync(self):
        try:
            self.rt.deviceSynchronize()
            return CUDA_SUCCESS, "cudaSuccess"
        except Exception as exc:  # pylint: disable=broad-except
            return self._err(exc)


class FakeMemory:
    """Host memory standing in for an exporter's device memory (--fake-gpu only)."""

    @staticmethod
    def path(pid):
        return os.path.join(os.environ[FAKE_DIR_ENV], f"exporter-{pid}.mem")

    @staticmethod
    def pack(pid, offset):
        return (b"FAKE" + struct.pack("<IQ", pid, offset)).ljust(64, b"\0")

    @staticmethod
    def unpack(raw):
        if raw[:4] != b"FAKE":
            return None
        return struct.unpack("<IQ", raw[4:16])


class FakeImporter:
    label = "fake (host memory)"

    def __init__(self, device):
        self.maps = {}  # pid -> mmap
        self.refs = {}  # ptr -> (pid, offset, count)
        self.broken = os.environ.get(FAKE_BREAK_ENV, "")

    def open(self, raw):
        parsed = FakeMemory.unpack(raw)
        if parsed is None:
            return CUDA_ERROR_INVALID_VALUE, None, "not a fake handle"
        pid, offset = parsed
        if pid == os.getpid():
            return CUDA_ERROR_INVALID_CONTEXT, None, "CUDA_ERROR_INVALID_CONTEXT(201)"
        if self.broken == "importer-crash":
            os._exit(3)
        if self.broken == "importer-hang":
            time.sleep(3600)
        if pid not in self.maps:
            with open(FakeMemory.path(pid), "r+b") as f:
                self.maps[pid] = mmap.mmap(f.fileno(), 0)
        ptr = FAKE_IMPORT_BASE + offset
        if self.broken == "importer-nondet":
            ptr += (os.getpid() % 7 + 1) * 4096
        _, _, count = self.refs.get(ptr, (pid, offset, 0))
        self.refs[ptr] = (pid, offset, count + 1)
        return CUDA_SUCCESS, ptr, "CUDA_SUCCESS(0)"

    def close(self, ptr):
        if ptr not in self.refs:
            return CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE(1)"
        pid, offset, count = self.refs[ptr]
        if count == 1:
            del self.refs[ptr]
        else:
            self.refs[ptr] = (pid, offset, count - 1)
        return CUDA_SUCCESS, "CUDA_SUCCESS(0)"

    def _locate(self, ptr):
        for base, (pid, offset, _) in self.refs.items():
            if base <= ptr < base + 4 * 64 * MIB:
                return self.maps[pid], offset + (ptr - base)
        raise RuntimeError(f"{hex(ptr)} is not mapped")

    def read(self, ptr, length):
        mem, at = self._locate(ptr)
        return bytes(mem[at:at + length])

    def write(self, ptr, data):
        if self.broken == "importer-no-write":
            return
        mem, at = self._locate(ptr)
        mem[at:at + len(data)] = data

    def sync(self):
        return CUDA_SUCCESS, "CUDA_SUCCESS(0)"


def run_importer(kind, spec):
    """Opens every handle in `spec`, checks, replies, closes; returns the result dict."""
    result = {"kind": kind, "run": spec["run"], "pid": os.getpid(), "ptrs": {}, "checks": []}
    role = f"importer-{kind} run{spec['run']}"

    def check(name, ok, detail):
        result["checks"].append([name, "PASS" if ok else "FAIL", detail])
        if not ok:  # the exporter prints every check; failures also show here, in order
            log(role, f"{name}: FAIL {detail}")
        return ok

    log(role, f"VMMIPC_RANK={os.environ.get('VMMIPC_RANK', '(unset)')}, "
              f"vmmipc mapped: {vmmipc_mapped()}")
    try:
        if os.environ.get(FAKE_DIR_ENV):
            gpu = FakeImporter(spec["device"])
        elif kind == "driver":
            gpu = DriverImporter(spec["device"])
        else:
            gpu = CupyImporter(spec["device"])
    except ImportError as exc:
        result["skip"] = f"{kind} importer cannot import its module: {exc}"
        return result
    except Exception as exc:  # pylint: disable=broad-except
        check("init", False, f"{type(exc).__name__}: {exc}")
        return result
    log(role, f"opening through {gpu.label}")

    handles = spec["handles"]
    opened = {}
    for name, h in handles.items():
        start = time.perf_counter()
        err, ptr, err_name = gpu.open(bytes.fromhex(h["hex"]))
        micros = (time.perf_counter() - start) * 1e6
        if check(f"open_{name}", err == CUDA_SUCCESS,
                 f"{h['what']}: {err_name} -> {hexptr(ptr)} in {micros:.0f} us"):
            opened[name] = ptr
            result["ptrs"][name] = ptr
    log(role, "pointers: " + ", ".join(f"{n}={hexptr(p)}" for n, p in opened.items()))

    exporter_ptrs = spec["exporter_ptrs"]
    if "A" in opened and "B" in opened:
        want = exporter_ptrs["B"] - exporter_ptrs["A"]
        got = opened["B"] - opened["A"]
        check("offset_B_minus_A_preserved", got == want,
              f"importer B - A = {hex(got)}, exporter {hex(want)} (ranked exporter: required)")

    for name, h in handles.items():
        if name not in opened:
            continue
        for rd in h["reads"]:
            label = f"read_{name}_{rd['label']}"
            try:
                data = gpu.read(opened[name] + rd["offset"], rd["length"])
            except Exception as exc:  # pylint: disable=broad-except
                check(label, False, f"read raised {type(exc).__name__}: {exc}")
                continue
            diff = describe_diff(data, pattern(rd["seed"], 0, rd["length"]))
            check(label, diff is None,
                  diff or f"{rd['length']} bytes at {name} + {hex(rd['offset'])} match")

    if spec.get("double_open") and "A" in opened:
        err, again, err_name = gpu.open(bytes.fromhex(handles["A"]["hex"]))
        check("open_twice_same_pointer", err == CUDA_SUCCESS and again == opened["A"],
              f"{err_name} -> {hexptr(again)}, first {hexptr(opened['A'])}")
        if err == CUDA_SUCCESS:
            err, err_name = gpu.close(again)
            check("close_first_of_two", err == CUDA_SUCCESS, err_name)
            try:
                tail = spec["a_bytes"] - STILL_MAPPED_WINDOW
                head_ok = gpu.read(opened["A"], STILL_MAPPED_WINDOW) == pattern(
                    SEED_A, 0, STILL_MAPPED_WINDOW)
                tail_ok = gpu.read(opened["A"] + tail, STILL_MAPPED_WINDOW) == pattern(
                    SEED_A, tail, STILL_MAPPED_WINDOW)
                check("readable_after_first_close", head_ok and tail_ok,
                      f"first/last 64 KiB of A match: {head_ok}/{tail_ok}")
            except Exception as exc:  # pylint: disable=broad-except
                check("readable_after_first_close", False, f"{type(exc).__name__}: {exc}")

    for name, h in handles.items():
        reply = h.get("reply")
        if name not in opened or not reply:
            continue
        try:
            gpu.write(opened[name], pattern(reply["seed"], 0, reply["length"]))
            check(f"write_reply_{name}", True, f"{reply['length']} bytes, seed {reply['seed']}")
        except Exception as exc:  # pylint: disable=broad-except
            check(f"write_reply_{name}", False, f"{type(exc).__name__}: {exc}")
    err, err_name = gpu.sync()
    check("synchronize", err == CUDA_SUCCESS, err_name)

    for name in reversed(list(opened)):
        err, err_name = gpu.close(opened[name])
        check(f"close_{name}", err == CUDA_SUCCESS, err_name)
    if spec.get("double_open") and "A" in opened:
        err, err_name = gpu.close(opened["A"])
        check("close_one_too_many_fails", err != CUDA_SUCCESS,
              f"{err_name} (the driver answers CUDA_ERROR_INVALID_VALUE)")
    return result


def importer_main(kind):
    """Reads the spec (JSON) on stdin, prints `RESULT <json>` on stdout."""
    try:
        spec = json.loads(sys.stdin.read())
        result = run_importer(kind, spec)
    except Exception:  # pylint: disable=broad-except
        result = {"kind": kind, "ptrs": {},
                  "checks": [["exception", "FAIL", traceback.format_exc(limit=4)]]}
    print("RESULT " + json.dumps(result), flush=True)
    return 0


# --- exporter ---------------------------------------------------------------------------------


class TorchExporter:
    """torch allocates and fills; cuda.bindings takes handles and reads back; CuPy optional."""

    def __init__(self, device, role):
        import torch  # pylint: disable=import-outside-toplevel
        self.torch = torch
        self.role = role
        if not torch.cuda.is_available() or torch.cuda.device_count() <= device:
            raise LookupError(f"torch sees no CUDA device {device} "
                              f"(device_count {torch.cuda.device_count()})")
        torch.cuda.set_device(device)
        self.device = torch.device("cuda", device)
        self.cu = Driver()
        self.tensors = []
        log(role, f"torch {torch.__version__} (CUDA {torch.version.cuda}), "
                  f"cuda.bindings {bindings_version()}, device {torch.cuda.get_device_name(device)}"
                  f", PYTORCH_CUDA_ALLOC_CONF={os.environ.get('PYTORCH_CUDA_ALLOC_CONF')}")
        torch.zeros(1, device=self.device)  # initialises CUDA and the primary context
        error = self.cu.make_context_current(device)
        if error:
            raise RuntimeError(error)
        self.cupy = None
        if importlib.util.find_spec("cupy") is not None:
            try:
                import cupy  # pylint: disable=import-outside-toplevel
                self.cupy = cupy
            except Exception as exc:  # pylint: disable=broad-except
                log(role, f"cupy is installed but does not import: {exc}")

    def alloc(self, length):
        tensor = self.torch.empty(length, dtype=self.torch.uint8, device=self.device)
        self.tensors.append(tensor)
        return tensor, tensor.data_ptr()

    def fill(self, tensor, data):
        host = self.torch.frombuffer(bytearray(data), dtype=self.torch.uint8)
        tensor.copy_(host)
        self.torch.cuda.synchronize()

    def segment_info(self, ptr):
        try:
            for seg in self.torch.cuda.memory_snapshot():
                base = seg.get("address", 0)
                if base <= ptr < base + seg.get("total_size", 0):
                    return (f"segment {hex(base)} size {hex(seg.get('total_size', 0))} "
                            f"is_expandable={seg.get('is_expandable', '?')}")
        except Exception as exc:  # pylint: disable=broad-except
            return f"memory_snapshot failed: {exc}"
        return "no segment found"

    def cupy_get_handle(self, ptr):
        if self.cupy is None:
            return None
        try:
            return CUDA_SUCCESS, bytes(self.cupy.cuda.runtime.ipcGetMemHandle(ptr)), "cudaSuccess"
        except Exception as exc:  # pylint: disable=broad-except
            status = getattr(exc, "status", None)
            return (int(status) if status is not None else CALL_RAISED), None, str(exc)


class FakeExporter:
    """--fake-gpu: a sparse host file stands in for the exporter's device memory."""

    def __init__(self, device, role):
        self.role = role
        self.path = FakeMemory.path(os.getpid())
        with open(self.path, "w+b") as f:
            f.truncate(256 * MIB)
            self.mem = mmap.mmap(f.fileno(), 0)
        self.next = 0
        self.base = FAKE_EXPORT_BASE
        if os.environ.get(FAKE_BREAK_ENV) == "exporter-nondet":
            self.base += (os.getpid() % 13 + 1) * 2 * MIB
        self.cu = self  # the exporter's driver-side calls are answered here
        self.cupy = True
        self.hooked = vmmipc_mapped()

    def alloc(self, length):
        offset = self.next
        self.next = (offset + length + 511) // 512 * 512
        return offset, self.base + offset

    def fill(self, tensor, data):
        self.mem[tensor:tensor + len(data)] = data

    def read(self, ptr, length):
        at = ptr - self.base
        return bytes(self.mem[at:at + length])

    def get_handle(self, ptr):
        if not self.hooked:
            return CUDA_ERROR_INVALID_VALUE, None, "CUDA_ERROR_INVALID_VALUE(1)"
        return CUDA_SUCCESS, FakeMemory.pack(os.getpid(), ptr - self.base), "CUDA_SUCCESS(0)"

    def open_handle(self, raw):
        return CUDA_ERROR_INVALID_CONTEXT, None, "CUDA_ERROR_INVALID_CONTEXT(201)"

    def close_handle(self, ptr):
        return CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE(1)"

    def attribute(self, attr_name, ptr):
        if attr_name.endswith("IS_LEGACY_CUDA_IPC_CAPABLE"):
            return CUDA_SUCCESS, int(self.hooked), "CUDA_SUCCESS(0)"
        return CUDA_SUCCESS, self.base, "CUDA_SUCCESS(0)"

    def address_range(self, ptr):
        base = self.base + (ptr - self.base) // FAKE_CHUNK * FAKE_CHUNK
        return CUDA_SUCCESS, (base, FAKE_CHUNK), "CUDA_SUCCESS(0)"

    def is_vmm(self, ptr):
        return True, "fake memory"

    def segment_info(self, ptr):
        return "fake segment"

    def cupy_get_handle(self, ptr):
        return self.get_handle(ptr)


def compare_device(cu, ptr, length, seed):
    """None when [ptr, ptr + length) holds pattern `seed`, else what differs or failed."""
    try:
        data = cu.read(ptr, length)
    except Exception as exc:  # pylint: disable=broad-except
        return f"read failed: {type(exc).__name__}: {exc}"
    return describe_diff(data, pattern(seed, 0, length))


def make_exporter(device, role):
    if os.environ.get(FAKE_DIR_ENV):
        return FakeExporter(device, role)
    return TorchExporter(device, role)


def exporter_setup(args, role):
    """Builds the exporter or prints why it cannot run; returns it or None (skip)."""
    try:
        return make_exporter(args.device, role)
    except ImportError as exc:
        emit(f"{args.tag}.prerequisites", "SKIP", f"cannot import: {exc}")
    except LookupError as exc:
        emit(f"{args.tag}.gpu", "SKIP", f"no CUDA device: {exc}")
    except Exception as exc:  # pylint: disable=broad-except
        emit(f"{args.tag}.init", "FAIL", f"{type(exc).__name__}: {exc}")
        sys.exit(1)
    return None


def run_importer_process(args, kind, spec, tag):
    """Runs one importer in a fresh process; returns its result dict or a failure description."""
    env = dict(os.environ)
    env["VMMIPC_RANK"] = "1"
    cmd = [sys.executable, os.path.abspath(__file__), "--role", f"importer-{kind}"]
    try:
        proc = subprocess.run(cmd, input=json.dumps(spec), stdout=subprocess.PIPE, env=env,
                              text=True, timeout=args.importer_timeout, check=False)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {args.importer_timeout} s (killed)"
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            try:
                return json.loads(line[len("RESULT "):]), None
            except ValueError as exc:
                return None, f"unreadable RESULT line: {exc}"
    tail = " | ".join(proc.stdout.strip().splitlines()[-3:])
    return None, f"no RESULT line, exit code {proc.returncode}; stdout tail: {tail!r}"


def exporter_main(args):
    tag = args.tag
    role = f"exporter {tag}"
    log(role, f"VMMIPC_RANK={os.environ.get('VMMIPC_RANK', '(unset)')}, "
              f"LD_PRELOAD={os.environ.get('LD_PRELOAD', '')!r}")
    ex = exporter_setup(args, role)
    if ex is None:
        return INTERNAL_SKIP
    cu = ex.cu
    loaded = vmmipc_mapped()
    emit(f"{tag}.exporter.vmmipc_loaded", "PASS" if loaded else "FAIL",
         "libvmmipc is mapped" if loaded else
         "libvmmipc is NOT mapped: run with LD_PRELOAD=/path/to/libvmmipc.so")

    tensor_a, ptr_a = ex.alloc(A_BYTES)
    tensor_b, ptr_b = ex.alloc(B_BYTES)
    log(role, f"A = {hex(ptr_a)} ({A_BYTES} bytes), B = {hex(ptr_b)} ({B_BYTES} bytes), "
              f"B - A = {hex(ptr_b - ptr_a)}; {ex.segment_info(ptr_a)}")
    ex.fill(tensor_a, pattern(SEED_A, 0, A_BYTES))
    ex.fill(tensor_b, pattern(SEED_B, 0, B_BYTES))

    vmm, detail = cu.is_vmm(ptr_a)
    emit(f"{tag}.exporter.tensor_is_vmm", "PASS" if vmm else "FAIL",
         detail if vmm else detail + ": expandable segments are not in effect, nothing below "
         "exercises VMM memory")
    diff = compare_device(cu, ptr_a, A_BYTES, SEED_A) or compare_device(cu, ptr_b, B_BYTES, SEED_B)
    emit(f"{tag}.exporter.fill", "PASS" if diff is None else "FAIL",
         diff or "torch fill reads back through cuMemcpyDtoH")

    err, capable, name = cu.attribute("CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE", ptr_a)
    emit(f"{tag}.exporter.ipc_capable_attribute", "PASS" if capable == 1 else "FAIL",
         f"IS_LEGACY_CUDA_IPC_CAPABLE={capable} ({name}; want 1 under vmmipc)")

    # Handles: A (tensor base), B (interior of the segment), C (range start + offset, as vLLM),
    # D (cuMemGetAddressRange base: the chunk mapping B starts in).
    exporter_handles = {}

    def get(name, ptr, what):
        start = time.perf_counter()
        err, raw, err_name = cu.get_handle(ptr)
        micros = (time.perf_counter() - start) * 1e6
        hint = ""
        if err == CUDA_ERROR_INVALID_VALUE:
            hint = (" (what the unhooked driver answers: is libvmmipc.so in LD_PRELOAD?)"
                    if not loaded else " (vmmipc is loaded but refused or did not see the call)")
        emit(f"{tag}.exporter.get_handle_{name}", "PASS" if err == CUDA_SUCCESS else "FAIL",
             f"cuIpcGetMemHandle({hex(ptr)}, {what}) -> {err_name} in {micros:.0f} us"
             + (f", handle {raw.hex()}" if raw else hint))
        if raw:
            exporter_handles[name] = {"hex": raw.hex(), "ptr": ptr, "what": what}

    get("A", ptr_a, "tensor A")
    get("B", ptr_b, "tensor B, interior of the segment")
    err, range_start, name = cu.attribute("CU_POINTER_ATTRIBUTE_RANGE_START_ADDR", ptr_b)
    if err:
        emit(f"{tag}.exporter.range_start", "FAIL", f"RANGE_START_ADDR(B): {name}")
    _, range_start_a, _ = cu.attribute("CU_POINTER_ATTRIBUTE_RANGE_START_ADDR", ptr_a)
    err, address_range, name = cu.address_range(ptr_b)
    if err:
        emit(f"{tag}.exporter.address_range", "FAIL", f"cuMemGetAddressRange(B): {name}")
    log(role, f"B: RANGE_START_ADDR {hexptr(range_start)}, cuMemGetAddressRange "
              f"{tuple(hex(v) for v in address_range) if address_range else None}")
    for name, base, what in (("C", range_start, "RANGE_START_ADDR of B"),
                             ("D", address_range[0] if address_range else None,
                              "cuMemGetAddressRange base of B")):
        if base is None or base > ptr_b:
            continue
        same = next((n for n, h in exporter_handles.items() if h["ptr"] == base), None)
        if same:
            exporter_handles[name] = dict(exporter_handles[same], what=f"{what} (= {same})")
            log(role, f"{name}: {what} is {hex(base)}, the address of {same}: reusing its handle")
        else:
            get(name, base, what)

    if "A" in exporter_handles:
        err, ptr, err_name = cu.open_handle(bytes.fromhex(exporter_handles["A"]["hex"]))
        if err == CUDA_SUCCESS:
            cu.close_handle(ptr)
        emit(f"{tag}.exporter.open_in_exporter_fails", "PASS" if err != CUDA_SUCCESS else "FAIL",
             f"cuIpcOpenMemHandle in the exporter -> {err_name} (the driver answers "
             f"CUDA_ERROR_INVALID_CONTEXT)")

    cupy_handle_a = None
    got = ex.cupy_get_handle(ptr_a)
    if got is None:
        emit(f"{tag}.exporter.cupy_get_handle", "SKIP", "cupy not installed")
    else:
        err, raw, err_name = got
        emit(f"{tag}.exporter.cupy_get_handle", "PASS" if err == CUDA_SUCCESS else "FAIL",
             f"cupy.cuda.runtime.ipcGetMemHandle(A) -> {err_name}"
             + (f", handle {raw.hex()}" if raw else ""))
        cupy_handle_a = raw

    # The same layout for every importer; only the reply seeds change.
    # A and B in one reservation, B after A: the run from A through B is mapped (one segment).
    contiguous = range_start is not None and range_start == range_start_a and ptr_b > ptr_a
    log(role, f"A and B {'share' if contiguous else 'do NOT share'} one reservation: "
              f"{'reading B through A too' if contiguous else 'no B_through_A read'}")
    def handles_for(kind, reply_a, reply_b):
        out = {}
        if "A" in exporter_handles:
            reads = [{"label": "A", "offset": 0, "length": A_BYTES, "seed": SEED_A}]
            if contiguous:
                reads.append({"label": "B_through_A", "offset": ptr_b - ptr_a, "length": B_BYTES,
                              "seed": SEED_B})
            raw_hex = exporter_handles["A"]["hex"]
            what = exporter_handles["A"]["what"]
            if kind == "cupy" and cupy_handle_a:
                raw_hex, what = cupy_handle_a.hex(), "tensor A, handle made by CuPy"
            out["A"] = {"hex": raw_hex, "what": what, "reads": reads,
                        "reply": {"length": A_BYTES, "seed": reply_a}}
        if "B" in exporter_handles:
            out["B"] = {"hex": exporter_handles["B"]["hex"], "what": exporter_handles["B"]["what"],
                        "reads": [{"label": "B", "offset": 0, "length": B_BYTES, "seed": SEED_B}],
                        "reply": {"length": B_BYTES, "seed": reply_b}}
        if kind == "driver":
            for name in ("C", "D"):
                if name in exporter_handles:
                    h = exporter_handles[name]
                    out[name] = {"hex": h["hex"], "what": h["what"],
                                 "reads": [{"label": "B", "offset": ptr_b - h["ptr"],
                                            "length": B_BYTES, "seed": SEED_B}]}
        return out

    importer_ptrs = {}
    for k_index, kind in enumerate(IMPORTER_KINDS):
        if kind == "cupy" and ex.cupy is None:
            emit(f"{tag}.{kind}", "SKIP", "cupy not installed")
            continue
        for run in (1, 2):
            prefix = f"{tag}.{kind}.run{run}"
            if "A" not in exporter_handles and "B" not in exporter_handles:
                emit(prefix, "FAIL", "no handle to import")
                continue
            reply_a = 100 + 10 * k_index + 2 * run
            reply_b = reply_a + 1
            ex.fill(tensor_a, pattern(SEED_A, 0, A_BYTES))
            ex.fill(tensor_b, pattern(SEED_B, 0, B_BYTES))
            spec = {"run": run, "device": args.device, "a_bytes": A_BYTES,
                    "double_open": kind == "driver",
                    "exporter_ptrs": {"A": ptr_a, "B": ptr_b},
                    "handles": handles_for(kind, reply_a, reply_b)}
            start = time.perf_counter()
            result, error = run_importer_process(args, kind, spec, tag)
            seconds = time.perf_counter() - start
            if result is None:
                emit(f"{prefix}.process", "FAIL", error)
                continue
            if result.get("skip"):
                emit(prefix, "SKIP", result["skip"])
                continue
            emit(f"{prefix}.process", "PASS", f"pid {result.get('pid')} ran in {seconds:.1f} s")
            for name, status, detail in result["checks"]:
                emit(f"{prefix}.{name}", status, detail)
            ptrs = {n: int(p) for n, p in result["ptrs"].items()}
            importer_ptrs[f"{kind}.run{run}"] = ptrs
            log(role, f"{kind} run{run} pointers: "
                      + ", ".join(f"{n}={hex(p)}" for n, p in sorted(ptrs.items())))
            for name, ptr, length, seed in (("A", ptr_a, A_BYTES, reply_a),
                                            ("B", ptr_b, B_BYTES, reply_b)):
                if name not in spec["handles"]:
                    continue
                diff = compare_device(cu, ptr, length, seed)
                emit(f"{prefix}.reply_{name}", "PASS" if diff is None else "FAIL",
                     diff or f"the importer's write through its {name} pointer landed in {name}")

    def compare(name, first, second, keys):
        one = importer_ptrs.get(first)
        two = importer_ptrs.get(second)
        if one is None or two is None or any(k not in one or k not in two for k in keys):
            emit(name, "SKIP", f"{first} or {second} did not open all of {', '.join(keys)}")
            return
        same = all(one[k] == two[k] for k in keys)
        emit(name, "PASS" if same else "FAIL",
             "; ".join(f"{k}: {hex(one[k])} / {hex(two[k])}" for k in keys))

    all_keys = [k for k in ("A", "B", "C", "D") if k in exporter_handles]
    compare(f"{tag}.determinism.driver_run1_vs_run2", "driver.run1", "driver.run2", all_keys)
    if ex.cupy is not None:
        ab = [k for k in ("A", "B") if k in exporter_handles]
        compare(f"{tag}.determinism.cupy_run1_vs_run2", "cupy.run1", "cupy.run2", ab)
        compare(f"{tag}.determinism.driver_vs_cupy", "driver.run1", "cupy.run1", ab)

    summary = {"exporter_ptrs": {"A": ptr_a, "B": ptr_b}, "importer_ptrs": importer_ptrs}
    print("EXPORTER_SUMMARY " + json.dumps(summary), flush=True)
    return 0


def baseline_main(args):
    """Without vmmipc: the driver refuses legacy IPC on the expandable-segment tensor."""
    tag = args.tag
    role = "baseline"
    ex = exporter_setup(args, role)
    if ex is None:
        return INTERNAL_SKIP
    cu = ex.cu
    loaded = vmmipc_mapped()
    emit(f"{tag}.vmmipc_not_loaded", "FAIL" if loaded else "PASS",
         "libvmmipc is mapped: the baseline must run without it" if loaded
         else "bare driver, as intended")
    tensor, ptr = ex.alloc(A_BYTES)
    ex.fill(tensor, pattern(SEED_A, 0, 4096).ljust(A_BYTES, b"\0"))
    vmm, detail = cu.is_vmm(ptr)
    emit(f"{tag}.tensor_is_vmm", "PASS" if vmm else "FAIL", f"{detail}; {ex.segment_info(ptr)}")
    err, capable, name = cu.attribute("CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE", ptr)
    emit(f"{tag}.ipc_capable_attribute_zero", "PASS" if capable == 0 else "FAIL",
         f"IS_LEGACY_CUDA_IPC_CAPABLE={capable} ({name}; the bare driver reports 0)")
    err, raw, err_name = cu.get_handle(ptr)
    ok = err == CUDA_ERROR_INVALID_VALUE
    emit(f"{tag}.get_handle_refused", "PASS" if ok else "FAIL",
         f"cuIpcGetMemHandle(expandable-segment tensor) without vmmipc -> {err_name}"
         + (": as measured (docs/driver-behaviour.md)" if ok
            else ": expected CUDA_ERROR_INVALID_VALUE"))
    return 0


# --- main -------------------------------------------------------------------------------------


def module_available(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


class Tally:
    def __init__(self):
        self.counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
        self.failed = []
        self.ran = False  # an exporter or the baseline got past its prerequisites
        self.ran_exporter = False

    def add_line(self, line):
        parts = line.split(" ", 3)
        if len(parts) >= 3 and parts[0] == "CHECK" and parts[2] in self.counts:
            self.counts[parts[2]] += 1
            if parts[2] == "FAIL":
                self.failed.append(parts[1])

    def emit(self, name, status, detail=""):
        emit(name, status, detail)
        self.add_line(f"CHECK {name} {status}")


_LIVE_GROUPS = set()  # process groups of running exporters, killed if main is terminated


def _terminate(signum, _frame):
    """SIGTERM/SIGINT in main (e.g. an outer `timeout`): take the exporters down too."""
    for pgid in list(_LIVE_GROUPS):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
    print(f"SUMMARY torch_ipc_check: interrupted by signal {signum}", flush=True)
    os._exit(128 + signum)


def run_role_process(args, role, tag, env, timeout, tally):
    """Runs `--role role` in a fresh session, streams and tallies its stdout.

    Returns (exit code or None on timeout, EXPORTER_SUMMARY dict or None)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--role", role, "--tag", tag,
           "--device", str(args.device), "--importer-timeout", str(args.importer_timeout)]
    summary = {}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env,
                            text=True, start_new_session=True)
    _LIVE_GROUPS.add(proc.pid)

    def pump():
        for line in proc.stdout:
            line = line.rstrip("\n")
            print(line, flush=True)
            tally.add_line(line)
            if line.startswith("EXPORTER_SUMMARY "):
                try:
                    summary["value"] = json.loads(line[len("EXPORTER_SUMMARY "):])
                except ValueError:
                    pass

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
        code = None
    _LIVE_GROUPS.discard(proc.pid)
    reader.join(timeout=10)
    return code, summary.get("value")


def main_role(args):
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, _terminate)
    start = time.monotonic()
    deadline = start + args.deadline_s
    tally = Tally()
    base_env = dict(os.environ)
    if args.fake_gpu:
        with tempfile.TemporaryDirectory(prefix="vmmipc-check-") as fake_dir:
            base_env[FAKE_DIR_ENV] = fake_dir
            print(f"NOTE --fake-gpu: host memory stands in for the GPU ({fake_dir}); this tests "
                  f"the script, not vmmipc", flush=True)
            return run_checks(args, tally, base_env, start, deadline)
    return run_checks(args, tally, base_env, start, deadline)


def run_checks(args, tally, base_env, start, deadline):
    """Main's body: prerequisites, baseline, exporter runs, cross-run comparisons."""
    if not base_env.get(FAKE_DIR_ENV):
        missing = [m for m, ok in (("torch", module_available("torch")),
                                   ("cuda.bindings (cuda-python)",
                                    module_available("cuda.bindings")
                                    or module_available("cuda.cuda")))
                   if not ok]
        if missing:
            tally.emit("prerequisites", "SKIP", f"not installed: {', '.join(missing)}")
            return finish(tally, args, start)
        if not module_available("cupy"):
            print("NOTE cupy is not installed: the CuPy importer checks will be skipped",
                  flush=True)

    preload = base_env.get("LD_PRELOAD", "")
    named = [p for p in preload.replace(":", " ").split() if "vmmipc" in p]
    if not named:
        preload_check = ("FAIL", f"LD_PRELOAD={preload!r} does not name libvmmipc.so: the "
                         "exporter and importers run on the bare driver")
    elif not all(os.path.exists(p) for p in named):
        preload_check = ("FAIL", f"LD_PRELOAD names a missing file: {named}")
    else:
        preload_check = ("PASS", f"LD_PRELOAD={preload}")
    print(f"NOTE preload: {preload_check[0]} {preload_check[1]}", flush=True)

    def remaining():
        return deadline - time.monotonic()

    if args.baseline or args.baseline_only or os.environ.get("GPU_CHECK_BASELINE") == "1":
        env = env_without_vmmipc(base_env)
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        print("== baseline (no vmmipc in LD_PRELOAD) ==", flush=True)
        code, _ = run_role_process(args, "baseline", "baseline", env,
                                   max(10, min(args.exporter_timeout, remaining())), tally)
        if code is None:
            tally.emit("baseline.process", "FAIL", "timed out (killed)")
        elif code not in (0, INTERNAL_SKIP):
            tally.emit("baseline.process", "FAIL", f"exit code {code}")
        tally.ran = tally.ran or code != INTERNAL_SKIP
        if args.baseline_only:
            return finish(tally, args, start)

    summaries = []
    for run in range(1, args.exporter_runs + 1):
        tag = f"e{run}"
        if remaining() < (10 if run == 1 else 30):
            # A first run that cannot start is a failure (the budget went elsewhere); a repeat
            # that does not fit only loses the cross-run comparison.
            tally.emit(f"{tag}.process", "FAIL" if run == 1 else "SKIP",
                       f"time budget: {remaining():.0f} s left of --deadline-s {args.deadline_s}")
            break
        env = dict(base_env)
        env["VMMIPC_RANK"] = "0"
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        print(f"== exporter run {run} of {args.exporter_runs} (VMMIPC_RANK=0, "
              f"expandable segments) ==", flush=True)
        t0 = time.monotonic()
        code, summary = run_role_process(args, "exporter", tag, env,
                                         min(args.exporter_timeout, remaining()), tally)
        took = time.monotonic() - t0
        if code != INTERNAL_SKIP and not tally.ran_exporter:
            tally.emit("preload", *preload_check)
        tally.ran_exporter = tally.ran_exporter or code != INTERNAL_SKIP
        tally.ran = tally.ran or tally.ran_exporter
        if code is None:
            tally.emit(f"{tag}.process", "FAIL", f"timed out after {took:.0f} s (killed)")
            break
        if code == INTERNAL_SKIP:
            break  # the exporter printed why (no GPU, missing module)
        if code != 0 or summary is None:
            tally.emit(f"{tag}.process", "FAIL", f"exit code {code}"
                       + ("" if summary else ", no EXPORTER_SUMMARY line"))
            continue
        tally.emit(f"{tag}.process", "PASS", f"exporter ran in {took:.1f} s")
        summaries.append(summary)

    if len(summaries) >= 2:
        one, two = summaries[0], summaries[1]
        same = one["exporter_ptrs"] == two["exporter_ptrs"]
        tally.emit("determinism.exporter_ptrs_across_exporter_runs", "PASS" if same else "FAIL",
                   f"A/B {hex(one['exporter_ptrs']['A'])}/{hex(one['exporter_ptrs']['B'])} vs "
                   f"{hex(two['exporter_ptrs']['A'])}/{hex(two['exporter_ptrs']['B'])} "
                   f"(design: the export arena makes torch's pointers repeat)")
        first = one["importer_ptrs"].get("driver.run1")
        second = two["importer_ptrs"].get("driver.run1")
        if first and second:
            same = first == second
            tally.emit("determinism.importer_ptrs_across_exporter_runs",
                       "PASS" if same else "FAIL",
                       "; ".join(f"{k}: {hex(first.get(k, 0))} / {hex(second.get(k, 0))}"
                                 for k in sorted(set(first) | set(second))))
        else:
            tally.emit("determinism.importer_ptrs_across_exporter_runs", "SKIP",
                       "a driver importer run opened nothing")
    return finish(tally, args, start)


def finish(tally, args, start):
    counts = tally.counts
    print(f"SUMMARY torch_ipc_check: {counts['PASS']} PASS, {counts['FAIL']} FAIL, "
          f"{counts['SKIP']} SKIP in {time.monotonic() - start:.1f} s", flush=True)
    if tally.failed:
        print("FAILED: " + " ".join(tally.failed), flush=True)
        return 1
    if not tally.ran:
        print(f"SKIPPED: nothing could run (exit {args.skip_exit_code})", flush=True)
        return args.skip_exit_code
    return 0


# --- self test --------------------------------------------------------------------------------


def self_test():
    """Checks the pure helpers (no CUDA); run with --self-test."""
    assert pattern(1, 0, 8192) == pattern(1, 0, 4096) + pattern(1, 4096, 4096)
    assert pattern(1, 100, 5000) == pattern(1, 0, 5100)[100:]
    assert pattern(1, 0, 4096) != pattern(2, 0, 4096)
    assert pattern(1, 0, 4096) != pattern(1, 4096, 4096)
    assert len(pattern(3, 12345, 3 * MIB + 7)) == 3 * MIB + 7
    big = pattern(SEED_A, 0, A_BYTES)
    assert len(big) == A_BYTES and big != pattern(SEED_A, 4096, A_BYTES)
    assert describe_diff(b"abc", b"abc") is None
    broken = bytearray(big[:MIB])
    broken[70000] ^= 0xFF
    text = describe_diff(bytes(broken), big[:MIB], offset=0x1000)
    assert hex(0x1000 + 70000) in text and "1 of 16" in text, text
    assert "zeros" in describe_diff(bytes(4096), pattern(5, 0, 4096))
    raw = bytes(range(64))
    assert handle_bytes(raw) == raw and handle_bytes(list(raw)) == raw
    assert handle_bytes([x - 256 if x > 127 else x for x in range(200, 264)]) == bytes(
        x & 0xFF for x in range(200, 264))
    env = env_without_vmmipc({"LD_PRELOAD": "/a/libx.so:/b/libvmmipc.so", "K": "v"})
    assert env == {"LD_PRELOAD": "/a/libx.so", "K": "v"}, env
    assert "LD_PRELOAD" not in env_without_vmmipc({"LD_PRELOAD": "/b/libvmmipc.so"})
    tally = Tally()
    for line in ("CHECK a PASS x", "CHECK b FAIL y z", "CHECK c SKIP", "noise", "CHECK d MAYBE"):
        tally.add_line(line)
    assert tally.counts == {"PASS": 1, "FAIL": 1, "SKIP": 1} and tally.failed == ["b"]
    print("self-test: OK", flush=True)
    return 0


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--role", default="main",
                        choices=["main", "exporter", "baseline", "importer-driver",
                                 "importer-cupy"],
                        help=argparse.SUPPRESS)
    parser.add_argument("--tag", default="e1", help=argparse.SUPPRESS)
    parser.add_argument("--device", type=int, default=0, help="CUDA device ordinal (default 0)")
    parser.add_argument("--exporter-runs", type=int, default=2,
                        help="fresh exporter processes; 2 also compares pointers across them")
    parser.add_argument("--importer-timeout", type=float, default=60.0,
                        help="seconds one importer process may take (default 60)")
    parser.add_argument("--exporter-timeout", type=float, default=240.0,
                        help="seconds one exporter run may take (default 240)")
    parser.add_argument("--deadline-s", type=float, default=420.0,
                        help="overall budget in seconds (default 420); a repeat exporter run "
                        "starts only with 30 s left")
    parser.add_argument("--baseline", action="store_true",
                        help="also run the baseline without vmmipc (as GPU_CHECK_BASELINE=1)")
    parser.add_argument("--baseline-only", action="store_true", help="run only the baseline")
    parser.add_argument("--skip-exit-code", type=int, default=0,
                        help="exit code when nothing could run (ctest uses 77; default 0)")
    parser.add_argument("--fake-gpu", action="store_true",
                        help="host memory instead of CUDA: tests this script's plumbing only")
    parser.add_argument("--self-test", action="store_true", help="test the pure helpers and exit")
    args = parser.parse_args(argv)
    if args.exporter_runs < 1:
        parser.error("--exporter-runs must be at least 1")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.self_test:
        return self_test()
    if args.role == "main":
        return main_role(args)
    if args.role == "exporter":
        return exporter_main(args)
    if args.role == "baseline":
        return baseline_main(args)
    return importer_main(args.role[len("importer-"):])


if __name__ == "__main__":
    sys.exit(main())
