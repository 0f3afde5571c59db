#!/usr/bin/env python3
"""Importers follow an exporter's memory-saver pause and resume (follow, the default; issues 14, 43).

With follow on, an exporter's pause unmaps the importers' mappings, so the memory is really
freed; its resume maps the new memory at the same importer addresses.

Two processes, both preloaded with libvmmipc.so: an EXPORTER on GPU 0 and an IMPORTER
(cuda.bindings) on GPU 1 when there are two GPUs with peer access, else on GPU 0 too. Each scenario:
  1. the exporter makes VMM memory (size --size-mib, default 64 MiB), fills pattern 1, pauses and
     resumes once with no importer (a control of the free-memory measurement), fills pattern 1
     again and takes two legacy handles: the base and an interior pointer;
  2. the importer opens both, checks pattern 1 through each, captures a CUDA graph (stream capture)
     that copies the whole peer memory into a local buffer, replays it and checks it;
  3. the exporter pauses (cuMemUnmap + cuMemRelease of every chunk, the reservation kept) and, both
     processes quiet, cuMemGetInfo must show the memory freed (within --slack-mib);
  4. the exporter resumes (cuMemCreate + cuMemMap at the same addresses + cuMemSetAccess) and
     writes pattern 2; the importer, at the same pointers without a new open, reads pattern 2
     directly and through the old graph's replay; the importer writes pattern 3, the exporter
     reads it; a new handle of the resumed memory opens at the importer's old pointer;
  5. the importer closes; both exit cleanly; their VMMIPC_STATS follow counters are checked.
Parts (--parts):
  stopped the raw exporter pauses and resumes --stopped-chunks chunks of 2 MiB (default 1024)
          while the importer is SIGSTOPped: about one VMMIPC_TIMEOUT_MS in all, not one per
          chunk; continued, the importer catches up and reads the resumed bytes
  raw     the exporter drives the driver itself through cuda.bindings: layout 2m (32 chunks of
          2 MiB, created without asking for POSIX fds: vmmipc adds them) and 32m (2 chunks of
          32 MiB, created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
  saver   the exporter is a torch process with torch_memory_saver in preload mode: a tensor
          allocated in torch_memory_saver.region(), torch_memory_saver.pause() / resume(); the
          base handle through cuda.bindings.runtime (cudaIpcGetMemHandle / cudaIpcOpenMemHandle)
Each part runs with vmmipc's defaults (follow on: no VMMIPC_FOLLOW in either process) and once
with VMMIPC_FOLLOW=0 in both (the baseline, legacy IPC's semantics): what happens there is
printed as INFO lines (the free memory does not go up, the importer keeps the old bytes); only
"nothing crashed" is a check there.

torch_memory_saver: imported if installed; else the wheel (--wheel, $MEMORY_SAVER_WHEEL, else
<repo>/.whl/torch_memory_saver-*.whl) is installed into a temporary folder (pip --no-deps
--no-index --target; a plain unzip when pip is missing). Its torch_memory_saver_hook_mode_preload
library goes into the exporter's LD_PRELOAD only, before libvmmipc.so (--saver-order).

Run: LD_PRELOAD=/path/to/libvmmipc.so python3 tests/python/memory_saver_check.py
(the harness removes VMMIPC_FOLLOW in each child, or sets it to 0 for the baseline).
Prints CHECK <name> PASS|FAIL|SKIP, INFO and MEASURE lines, and
`SUMMARY memory_saver_check: N PASS, M FAIL, K SKIP`. Exit 0 when no check failed, 1 when one did,
77 when nothing could run here (no cuda.bindings, no GPU, no libvmmipc.so in LD_PRELOAD).
"""
import argparse
import glob
import importlib.util
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
# cuda.bindings wrapper (never raises) and the offset-aware patterns of the PyTorch check.
from torch_ipc_check import (  # noqa: E402
    Driver, describe_diff, handle_bytes, load_driver_module, pattern)

SKIP = 77
# Testing this script (tests/scripts/test_memory_saver_check.py): ROLE:COMMAND makes that child
# die (exit 3) on that command, ROLE:COMMAND:hang makes it stop answering.
BREAK_ENV = "MEMORY_SAVER_CHECK_BREAK"
MIB = 1 << 20
# layout name -> (chunk bytes, ask cuMemCreate for POSIX fds)
LAYOUTS = {"2m": (2 * MIB, False), "32m": (32 * MIB, True)}
SEED_FIRST, SEED_RESUMED, SEED_IMPORTER = 1, 2, 3
STDERR_LINES_SHOWN = 300
SAVER_STEM = "torch_memory_saver_hook_mode_preload"
# Run in a child: the preload library torch_memory_saver picks for this torch, and where the
# libraries it needs that the loader does not find (libcudart.so.N of a pip torch) are.
SAVER_PROBE = """
import glob, os, subprocess, torch, torch_memory_saver
from torch_memory_saver.utils import get_binary_path_from_package as find
so = str(find({stem!r}))
print('SO', so)
print('VERSION', torch.__version__, 'CUDA', torch.version.cuda, torch_memory_saver.__file__)
try:
    ldd = subprocess.run(['ldd', so], capture_output=True, text=True, timeout=60).stdout
except (OSError, subprocess.TimeoutExpired):
    ldd = ''
missing = [l.split()[0] for l in ldd.splitlines() if 'not found' in l]
site = os.path.dirname(os.path.dirname(torch.__file__))
dirs = []
for name in missing:
    hits = glob.glob(os.path.join(site, 'nvidia', '**', name), recursive=True)
    if hits and os.path.dirname(hits[0]) not in dirs:
        dirs.append(os.path.dirname(hits[0]))
print('MISSING', ' '.join(missing))
print('LIBDIRS', ':'.join(dirs))
"""


def interior_offset(size):
    """An interior pointer past the first chunk(s), not 2 MiB aligned."""
    return size // 2 + 2 * MIB + 4096


def which_seed(data, start, candidates):
    """The candidate pattern seed that `data` (bytes at offset `start`) matches, or None."""
    for seed in candidates:
        if data == pattern(seed, start, len(data)):
            return seed
    return None


def read_report(data, start, want, candidates):
    """{"ok", "seed", "detail"} for bytes that should hold pattern `want`."""
    seed = which_seed(data, start, candidates)
    if seed == want:
        return {"ok": True, "seed": seed, "detail": f"pattern {want}"}
    if seed is not None:
        return {"ok": False, "seed": seed, "detail": f"pattern {seed}, not {want}"}
    return {"ok": False, "seed": None,
            "detail": describe_diff(data, pattern(want, start, len(data)), start)}


def mapped(name):
    """True when a library whose path contains `name` is mapped into this process."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return any(name in line for line in maps)
    except OSError:
        return False


def reply(obj):
    sys.stdout.write("REPLY " + json.dumps(obj) + "\n")
    sys.stdout.flush()


def log(role, message):
    sys.stderr.write(f"[{role} pid {os.getpid()}] {message}\n")
    sys.stderr.flush()


def load_runtime_module():
    """cuda.bindings.runtime, else the older `from cuda import cudart`; None if neither."""
    try:
        from cuda.bindings import runtime  # pylint: disable=import-outside-toplevel
        return runtime
    except ImportError:
        try:
            from cuda import cudart  # pylint: disable=import-outside-toplevel
            return cudart
        except ImportError:
            return None


class Runtime:
    """The legacy IPC calls of cuda.bindings.runtime as (err, value, text); never raises."""

    def __init__(self):
        self.rt = load_runtime_module()

    def call(self, fn, *args):
        if self.rt is None:
            return -1, None, "cuda.bindings.runtime is not installed"
        try:
            out = getattr(self.rt, fn)(*args)
        except Exception as exc:  # pylint: disable=broad-except
            return -1, None, f"{fn} raised {type(exc).__name__}: {exc}"
        if not isinstance(out, tuple):
            out = (out,)
        err = int(out[0])
        value = out[1] if len(out) > 1 else None
        name = getattr(out[0], "name", str(err))
        return err, value, f"{fn}: {name}({err})"

    @staticmethod
    def unavailable(err):
        """True when the call could not be made at all (module missing, library not loaded)."""
        return err == -1

    def get_handle(self, ptr):
        """(raw, "", False) or (None, why, unavailable)."""
        err, handle, text = self.call("cudaIpcGetMemHandle", ptr)
        if err:
            return None, text, self.unavailable(err)
        try:
            return handle_bytes(handle.reserved), "", False
        except Exception as exc:  # pylint: disable=broad-except
            return None, f"reading cudaIpcMemHandle_t.reserved: {exc}", False

    def open_handle(self, raw, device):
        err, _, text = self.call("cudaSetDevice", device)
        if err:
            return None, text
        try:
            handle = self.rt.cudaIpcMemHandle_t()
            handle.reserved = raw
        except Exception as exc:  # pylint: disable=broad-except
            return None, f"building cudaIpcMemHandle_t: {exc}"
        flag = int(getattr(self.rt.cudaIpcMemLazyEnablePeerAccess, "value",
                           self.rt.cudaIpcMemLazyEnablePeerAccess))
        err, ptr, text = self.call("cudaIpcOpenMemHandle", handle, flag)
        return (None, text) if err else (int(ptr), "")

    def close_handle(self, ptr):
        err, _, text = self.call("cudaIpcCloseMemHandle", ptr)
        return "" if not err else text


# --- children: exporters and the importer ----------------------------------------------------


class ExporterBase:
    """What both exporters share: patterns, free memory, handles, the command set."""

    role = "exporter"

    def __init__(self, device):
        self.device = device
        self.cu = Driver()
        self.base = None
        self.size = 0
        self.chunks = 0

    def free_bytes(self):
        err, value, name = self.cu.call("cuMemGetInfo")
        if err:
            raise RuntimeError(f"cuMemGetInfo: {name}")
        return int(value[0])

    def settled_free(self, settle_s=1.0):
        """(first sample, highest sample within settle_s): freed memory may show up late."""
        first = best = self.free_bytes()
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline:
            time.sleep(0.1)
            best = max(best, self.free_bytes())
        return first, best

    def fill(self, seed):
        self.cu.write(self.base, pattern(seed, 0, self.size))
        err, name = self.cu.sync()
        if err:
            raise RuntimeError(f"cuCtxSynchronize after the fill: {name}")

    def sync(self):
        err, name = self.cu.sync()
        if err:
            raise RuntimeError(f"cuCtxSynchronize: {name}")

    def driver_handle(self, ptr):
        err, raw, name = self.cu.get_handle(ptr)
        if err:
            raise RuntimeError(f"cuIpcGetMemHandle({ptr:#x}): {name}")
        return raw

    def handles(self, runtime_base):
        """The base handle (runtime API when asked, falling back to the driver) and an interior."""
        out, notes = [], []
        if runtime_base:
            raw, why, unavailable = Runtime().get_handle(self.base)
            if raw is None:
                notes.append(f"runtime cudaIpcGetMemHandle failed ({why}): driver used")
                out.append({"name": "base", "hex": self.driver_handle(self.base).hex(),
                            "api": "driver", "offset": 0, "runtime_error": why,
                            "runtime_unavailable": unavailable})
            else:
                out.append({"name": "base", "hex": raw.hex(), "api": "runtime", "offset": 0})
        else:
            out.append({"name": "base", "hex": self.driver_handle(self.base).hex(),
                        "api": "driver", "offset": 0})
        offset = interior_offset(self.size)
        out.append({"name": "interior", "hex": self.driver_handle(self.base + offset).hex(),
                    "api": "driver", "offset": offset})
        return out, notes

    # Subclasses: _allocate(layout, size), _pause(), _resume(), address_now(), cleanup().

    def do_setup(self, layout, size, seed, runtime_base):
        info = self._allocate(layout, size)
        self.fill(seed)
        # Control: a pause and resume before any importer exists must free the memory (else the
        # free-memory measurement itself, not the follow, is what does not work here).
        self.sync()
        before = self.free_bytes()
        self._pause()
        after, settled = self.settled_free(0.5)
        self._resume()
        self.fill(seed)
        handles, notes = self.handles(runtime_base)
        info.update({"base": self.base, "size": self.size, "chunks": self.chunks,
                     "handles": handles, "notes": notes,
                     "control": {"before": before, "after": after, "settled": settled}})
        return info

    def do_pause(self):
        self.sync()
        noise_a = self.free_bytes()
        time.sleep(0.2)
        before = self.free_bytes()
        start = time.perf_counter()
        self._pause()
        seconds = time.perf_counter() - start
        after, settled = self.settled_free()
        return {"before": before, "noise": abs(before - noise_a), "after": after,
                "settled": settled, "seconds": seconds}

    def do_resume(self, seed):
        before = self.free_bytes()
        address = self.address_now()
        start = time.perf_counter()
        self._resume()
        seconds = time.perf_counter() - start
        self.fill(seed)
        return {"before": before, "after": self.free_bytes(), "seconds": seconds,
                "same_address": self.address_now() == address == self.base}

    def do_expect(self, seed, candidates):
        self.sync()
        return read_report(self.cu.read(self.base, self.size), 0, seed, candidates)

    def do_handle(self):
        return {"hex": self.driver_handle(self.base).hex()}

    def address_now(self):
        return self.base

    def cleanup(self):
        pass


class RawExporter(ExporterBase):
    """VMM memory made with cuda.bindings: one reservation, chunks created and mapped by hand."""

    role = "exporter-raw"

    def __init__(self, device):
        super().__init__(device)
        why = self.cu.make_context_current(device)
        if why:
            raise RuntimeError(why)
        self.handles_by_chunk = []
        self.chunk_size = 0
        self.posix_fd = False

    def _call(self, fn, *args):
        err, value, name = self.cu.call(fn, *args)
        if err:
            raise RuntimeError(f"{fn}: {name}")
        return value

    def _prop(self):
        d = self.cu.drv
        prop = d.CUmemAllocationProp()
        prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = self.device
        if self.posix_fd:
            prop.requestedHandleTypes = \
                d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        return prop

    def _allocate(self, layout, size):
        d = self.cu.drv
        self.chunk_size, self.posix_fd = LAYOUTS[layout]
        granularity = int(self._call("cuMemGetAllocationGranularity", self._prop(),
                                     d.CUmemAllocationGranularity_flags
                                     .CU_MEM_ALLOC_GRANULARITY_MINIMUM))
        if self.chunk_size % granularity or size % self.chunk_size:
            raise RuntimeError(f"chunk {self.chunk_size} / size {size} do not fit granularity "
                               f"{granularity}")
        self.size = size
        self.chunks = size // self.chunk_size
        self.base = int(self._call("cuMemAddressReserve", size, 0, 0, 0))
        self._resume()
        return {"layout": layout, "chunk_size": self.chunk_size,
                "posix_fd_requested": self.posix_fd, "granularity": granularity}

    def _pause(self):
        # As torch_memory_saver and vLLM's sleep do: unmap and release, keep the reservation.
        for i, handle in enumerate(self.handles_by_chunk):
            self._call("cuMemUnmap", self.cu.ptr(self.base + i * self.chunk_size), self.chunk_size)
            self._call("cuMemRelease", handle)
        self.handles_by_chunk = []

    def _resume(self):
        d = self.cu.drv
        prop = self._prop()
        for i in range(self.chunks):
            handle = self._call("cuMemCreate", self.chunk_size, prop, 0)
            self.handles_by_chunk.append(handle)
            self._call("cuMemMap", self.cu.ptr(self.base + i * self.chunk_size), self.chunk_size,
                       0, handle, 0)
        desc = d.CUmemAccessDesc()
        desc.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        desc.location.id = self.device
        desc.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self._call("cuMemSetAccess", self.cu.ptr(self.base), self.size, [desc], 1)

    def cleanup(self):
        if self.base is None:
            return
        try:
            self.sync()
            self._pause()
            self._call("cuMemAddressFree", self.cu.ptr(self.base), self.size)
        except Exception as exc:  # pylint: disable=broad-except
            log(self.role, f"cleanup: {exc}")


class SaverExporter(ExporterBase):
    """A torch tensor allocated in a torch_memory_saver region (preload mode)."""

    role = "exporter-saver"

    def __init__(self, device):
        super().__init__(device)
        # Before torch_memory_saver's own CDLL() of it: only a preload interposes cudaMalloc.
        self.saver_preloaded = mapped(SAVER_STEM)
        import torch  # pylint: disable=import-outside-toplevel
        from torch_memory_saver import torch_memory_saver  # pylint: disable=import-outside-toplevel
        self.torch = torch
        self.saver = torch_memory_saver
        self.tensor = None
        torch.cuda.set_device(device)

    def _allocate(self, layout, size):
        torch = self.torch
        with self.saver.region():
            self.tensor = torch.empty(size, dtype=torch.uint8, device=f"cuda:{self.device}")
        torch.cuda.synchronize()
        why = self.cu.make_context_current(self.device)  # torch's primary context, for the driver
        if why:
            raise RuntimeError(why)
        self.base = self.tensor.data_ptr()
        self.size = size
        is_vmm, vmm_why = self.cu.is_vmm(self.base)
        err, mapping, name = self.cu.address_range(self.base)
        if err:
            raise RuntimeError(f"cuMemGetAddressRange: {name}")
        map_base, map_size = mapping
        # torch_memory_saver: one cuMemCreate + cuMemMap per cudaMalloc, so one chunk.
        self.chunks = 1 if map_base == self.base and map_size >= size else 0
        if not self.saver_preloaded:
            vmm_why += ("; torch_memory_saver's library was NOT preloaded (ld.so ignored it: is "
                        "its libcudart on the loader path?)")
        return {"layout": "saver", "is_vmm": is_vmm, "vmm_detail": vmm_why,
                "saver_preloaded": self.saver_preloaded,
                "mapping": [map_base, map_size], "torch": torch.__version__}

    def _pause(self):
        self.torch.cuda.synchronize()
        self.saver.pause()

    def _resume(self):
        self.saver.resume()

    def address_now(self):
        return self.tensor.data_ptr()

    def cleanup(self):
        self.tensor = None


class Importer:
    """cuda.bindings importer: opens the handles, reads, captures and replays a graph, writes."""

    role = "importer"

    def __init__(self, device):
        self.device = device
        self.cu = Driver()
        why = self.cu.make_context_current(device)
        if why:
            raise RuntimeError(why)
        self.rt = Runtime()
        self.opened = {}  # name -> {"ptr", "api", "offset"}
        self.size = 0
        self.local = None
        self.stream = None
        self.graph = None
        self.graph_exec = None

    def _call(self, fn, *args):
        err, value, name = self.cu.call(fn, *args)
        if err:
            raise RuntimeError(f"{fn}: {name}")
        return value

    def _open(self, raw, api):
        if api == "runtime":
            ptr, why = self.rt.open_handle(raw, self.device)
            return ptr, why
        err, ptr, name = self.cu.open_handle(raw)
        return (None, f"cuIpcOpenMemHandle: {name}") if err else (ptr, "")

    def _read_all(self, want, candidates):
        out = {}
        for name, h in self.opened.items():
            try:
                data = self.cu.read(h["ptr"], self.size - h["offset"])
                out[name] = read_report(data, h["offset"], want, candidates)
            except Exception as exc:  # pylint: disable=broad-except
                out[name] = {"ok": False, "seed": None, "detail": f"read failed: {exc}"}
        return out

    def _replay(self, want, candidates):
        if self.graph_exec is None:
            return {"ok": False, "seed": None, "detail": "no graph (its capture failed)"}
        try:
            self._call("cuMemsetD8", self.local, 0, self.size)
            self._call("cuGraphLaunch", self.graph_exec, self.stream)
            self._call("cuStreamSynchronize", self.stream)
            return read_report(self.cu.read(int(self.local), self.size), 0, want, candidates)
        except Exception as exc:  # pylint: disable=broad-except
            return {"ok": False, "seed": None, "detail": f"replay failed: {exc}"}

    def do_open(self, handles, size, seed):
        self.size = size
        errors = []
        for h in handles:
            raw = bytes.fromhex(h["hex"])
            ptr, why = self._open(raw, h["api"])
            api = h["api"]
            if ptr is None and api == "runtime":
                errors.append(f"{h['name']}: runtime open failed ({why}), driver used")
                api = "driver"
                ptr, why = self._open(raw, api)
            if ptr is None:
                errors.append(f"{h['name']}: {why}")
                continue
            self.opened[h["name"]] = {"ptr": ptr, "api": api, "offset": h["offset"]}
        if "base" not in self.opened:
            return {"ok": False, "error": "; ".join(errors)}
        reads = self._read_all(seed, [seed])
        d = self.cu.drv
        base = self.opened["base"]["ptr"]
        try:  # a graph that copies the whole peer memory into a local buffer
            self.local = self._call("cuMemAlloc", size)
            self.stream = self._call("cuStreamCreate", 0)
            self._call("cuStreamBeginCapture", self.stream,
                       d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)
            self._call("cuMemcpyDtoDAsync", self.local, self.cu.ptr(base), size, self.stream)
            self.graph = self._call("cuStreamEndCapture", self.stream)
            self.graph_exec = self._call("cuGraphInstantiate", self.graph, 0)
            replay = self._replay(seed, [seed])
        except Exception as exc:  # pylint: disable=broad-except
            replay = {"ok": False, "seed": None, "detail": f"graph capture failed: {exc}"}
        self.sync()
        return {"ptrs": {n: h["ptr"] for n, h in self.opened.items()},
                "apis": {n: h["api"] for n, h in self.opened.items()},
                "errors": errors, "reads": reads, "replay": replay}

    def do_ready(self):
        return {}  # the constructor made the context: its memory is taken before any measure

    def do_check(self, seed, candidates):
        return {"reads": self._read_all(seed, candidates), "replay": self._replay(seed, candidates)}

    def do_peek(self, seed, candidates):
        """The base open's last 4 KiB only: cheap enough to poll (a whole check reads the memory
        three times over, and its reads compete with the follow thread for the driver)."""
        h = self.opened["base"]
        start = self.size - 4096
        try:
            data = self.cu.read(h["ptr"] + start, 4096)
            return {"ok": True, "read": read_report(data, h["offset"] + start, seed, candidates)}
        except Exception as exc:  # pylint: disable=broad-except
            return {"ok": True, "read": {"ok": False, "seed": None, "detail": f"{exc}"}}

    def do_write(self, seed):
        self.cu.write(self.opened["base"]["ptr"], pattern(seed, 0, self.size))
        self.sync()
        return {}

    def do_reopen(self, hex_handle):
        err, ptr, name = self.cu.open_handle(bytes.fromhex(hex_handle))
        if err:
            return {"ok": False, "error": f"cuIpcOpenMemHandle of the new handle: {name}"}
        err, close_name = self.cu.close_handle(ptr)
        return {"ptr": ptr, "old": self.opened["base"]["ptr"],
                "close_error": close_name if err else ""}

    def do_close(self):
        errors = []
        for fn, attr in (("cuGraphExecDestroy", "graph_exec"), ("cuGraphDestroy", "graph"),
                         ("cuStreamDestroy", "stream"), ("cuMemFree", "local")):
            if getattr(self, attr) is not None:
                err, _, name = self.cu.call(fn, getattr(self, attr))
                setattr(self, attr, None)
                if err:
                    errors.append(f"{fn}: {name}")
        for name, h in list(self.opened.items()):
            if h["api"] == "runtime":
                why = self.rt.close_handle(h["ptr"])
            else:
                err, why = self.cu.close_handle(h["ptr"])
                why = why if err else ""
            if why:
                errors.append(f"close {name}: {why}")
            del self.opened[name]
        return {"ok": not errors, "error": "; ".join(errors)}

    def sync(self):
        err, name = self.cu.sync()
        if err:
            raise RuntimeError(f"cuCtxSynchronize: {name}")

    def cleanup(self):
        if self.opened:
            self.do_close()


ROLES = {"exporter-raw": RawExporter, "exporter-saver": SaverExporter, "importer": Importer}


def child_main(role, device):
    """Answers one JSON command per stdin line with one REPLY line; logs go to stderr."""
    try:
        worker = ROLES[role](device)
        startup_error = None
    except ImportError as exc:
        worker, startup_error = None, {"ok": False, "skip": True,
                                       "error": f"{type(exc).__name__}: {exc}"}
    except Exception as exc:  # pylint: disable=broad-except
        worker, startup_error = None, {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                                       "trace": traceback.format_exc()[-1500:]}
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            msg = json.loads(line)
            cmd = msg.pop("cmd")
        except (ValueError, KeyError, AttributeError):
            reply({"ok": False, "error": f"bad command {line.strip()!r}"})
            continue
        if cmd == "exit":
            break
        if os.environ.get(BREAK_ENV, "").startswith(f"{role}:{cmd}"):
            if os.environ[BREAK_ENV].endswith(":hang"):
                time.sleep(3600)
            os._exit(3)
        if startup_error is not None:
            reply(startup_error)
            continue
        method = getattr(worker, "do_" + cmd, None)
        if method is None:
            reply({"ok": False, "error": f"unknown command {cmd}"})
            continue
        try:
            out = method(**msg)
            out.setdefault("ok", True)
        except Exception as exc:  # pylint: disable=broad-except
            log(role, traceback.format_exc())
            out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        reply(out)
    if worker is not None:
        worker.cleanup()
    return 0


# --- the parent ------------------------------------------------------------------------------

_CHILDREN = []  # live Popen objects, killed if the parent is terminated


def _terminate(signum, _frame):
    for proc in list(_CHILDREN):
        if proc.poll() is None:
            proc.kill()
    print(f"SUMMARY memory_saver_check: interrupted by signal {signum}", flush=True)
    os._exit(128 + signum)


class ChildError(Exception):
    """A child died, hung or stopped answering."""


class _Stop(Exception):
    """The sequence cannot go on; the reason is already printed (not a crash)."""


class _Skip(Exception):
    """This part cannot run here."""


class Child:
    """One child process: JSON commands in, REPLY lines out, stderr kept in a file."""

    def __init__(self, role, device, env, folder, tag):
        self.role = role
        self.tag = tag
        self.log_path = os.path.join(folder, f"{tag}.{role}.stderr")
        self.log = open(self.log_path, "w+", encoding="utf-8", errors="replace")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--role", role, "--device", str(device)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        _CHILDREN.append(self.proc)
        self.lines = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.broken = None  # why it stopped answering

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def ask(self, timeout, cmd, **fields):
        """The reply dict; ChildError when the child died, hung or already broke."""
        if self.broken:
            raise ChildError(self.broken)
        try:
            self.proc.stdin.write(json.dumps(dict(fields, cmd=cmd)) + "\n")
            self.proc.stdin.flush()
        except OSError as exc:
            self.broken = f"{self.role}: cannot send {cmd}: {exc}"
            raise ChildError(self.broken) from exc
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self.lines.get(timeout=max(left, 0.01))
            except queue.Empty:
                self.broken = f"{self.role}: no answer to {cmd} in {timeout:.0f} s"
                raise ChildError(self.broken) from None
            if line is None:
                code = self.proc.wait()
                self.broken = f"{self.role} ended during {cmd}: {describe_exit(code)}"
                raise ChildError(self.broken)
            if line.startswith("REPLY "):
                return json.loads(line[len("REPLY "):])
            sys.stderr.write(f"[{self.tag} {self.role} stdout] {line}")

    def finish(self, timeout=60):
        """Asks it to exit; its exit code (killed after `timeout`: None)."""
        if self.broken:
            timeout = 5  # it stopped answering: no long wait
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        return self.proc.returncode

    def stderr_text(self):
        self.log.flush()
        with open(self.log_path, encoding="utf-8", errors="replace") as text:
            return text.read()

    def dump_stderr(self):
        lines = self.stderr_text().splitlines()
        sys.stderr.write(f"----- {self.tag} {self.role} (pid {self.proc.pid}) stderr: "
                         f"{len(lines)} lines -----\n")
        if len(lines) > STDERR_LINES_SHOWN:
            head = STDERR_LINES_SHOWN // 3
            lines = (lines[:head] + [f"... {len(lines) - STDERR_LINES_SHOWN} lines left out ..."]
                     + lines[-(STDERR_LINES_SHOWN - head):])
        for line in lines:
            sys.stderr.write(f"[{self.tag} {self.role}] {line}\n")
        sys.stderr.flush()


def describe_exit(code):
    if code is None:
        return "killed after it did not exit"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


def follow_stats(text):
    """The follow_* counters of the VMMIPC_STATS report, and whether a report was printed."""
    counters = {name: int(value) for name, value in re.findall(r"\b(follow_[a-z_]+)=(\d+)", text)}
    return counters, "stats at exit" in text


class Checks:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0

    def check(self, name, ok, detail=""):
        text = " ".join(str(detail).split())
        print(f"CHECK {name} {'PASS' if ok else 'FAIL'} {text}".rstrip(), flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        return ok

    def skip(self, name, why):
        print(f"CHECK {name} SKIP {' '.join(str(why).split())}", flush=True)
        self.skipped += 1

    @staticmethod
    def info(name, detail):
        print(f"INFO {name} {' '.join(str(detail).split())}", flush=True)

    @staticmethod
    def measure(name, detail):
        print(f"MEASURE {name} {detail}", flush=True)


def mib(n):
    return f"{n / MIB:.1f} MiB"


class Scenario:
    """One exporter + one importer through the whole sequence. follow=False: the baseline,
    where every result is an INFO line and only `no_crash` is a check."""

    def __init__(self, checks, opts, tag, exporter_role, layout, follow, env_exporter,
                 env_importer, runtime_base):
        self.checks = checks
        self.opts = opts
        self.tag = tag if follow else f"baseline.{tag}"
        self.exporter_role = exporter_role
        self.layout = layout
        self.follow = follow
        self.env_exporter = env_exporter
        self.env_importer = env_importer
        self.runtime_base = runtime_base
        self.size = opts.size_mib * MIB
        self.slack = opts.slack_mib * MIB

    def verdict(self, name, ok, detail):
        """A check with follow; an INFO line (saying what follow would need) in the baseline."""
        if self.follow:
            return self.checks.check(f"{self.tag}.{name}", ok, detail)
        self.checks.info(f"{self.tag}.{name}", f"{detail} [as follow requires: "
                                                f"{'yes' if ok else 'no'}]")
        return ok

    def run(self, folder):
        opts = self.opts
        exporter = Child(self.exporter_role, opts.exporter_device, self.env_exporter, folder,
                         self.tag)
        importer = Child("importer", opts.importer_device, self.env_importer, folder, self.tag)
        children = (exporter, importer)
        crashed = None
        try:
            self.sequence(exporter, importer)
        except _Stop:
            pass
        except ChildError as exc:
            crashed = str(exc)
            if self.follow:
                self.checks.check(f"{self.tag}.children_answer", False, crashed)
        except _Skip as exc:
            self.checks.skip(self.tag, str(exc))
            for child in children:
                child.finish()
                child.dump_stderr()
            return
        codes = [child.finish() for child in children]
        exits = ", ".join(f"{c.role} {describe_exit(code)}" for c, code in zip(children, codes))
        clean = all(code == 0 for code in codes)
        if self.follow:
            self.checks.check(f"{self.tag}.processes_exit_cleanly", clean, exits)
        else:
            self.checks.check(f"{self.tag}.no_crash", clean and crashed is None,
                              f"{exits}{'; ' + crashed if crashed else ''}")
        self.judge_stats(exporter, importer)
        for child in children:
            child.dump_stderr()

    def judge_stats(self, exporter, importer):
        exp, exp_report = follow_stats(exporter.stderr_text())
        imp, imp_report = follow_stats(importer.stderr_text())
        chunks = getattr(self, "chunks", None)
        if chunks is None:
            return  # the sequence stopped before the memory was made
        detail_imp = (f"importer {imp or 'no follow_* counters'}"
                      f"{'' if imp_report else ' (no VMMIPC_STATS report)'}; expected "
                      f"follow_pauses = follow_resumes = {chunks} chunks, no refusal")
        detail_exp = (f"exporter {exp or 'no follow_* counters'}"
                      f"{'' if exp_report else ' (no VMMIPC_STATS report)'}; expected "
                      f"follow_notices >= 1, follow_unanswered = 0")
        if not self.follow:
            self.checks.info(f"{self.tag}.follow_stats", f"{detail_imp}; {detail_exp}")
            return
        self.checks.check(f"{self.tag}.importer_follow_stats",
                          imp_report and imp.get("follow_pauses") == chunks
                          and imp.get("follow_resumes") == chunks
                          and imp.get("follow_resume_refused", 0) == 0, detail_imp)
        self.checks.check(f"{self.tag}.exporter_follow_stats",
                          exp_report and exp.get("follow_notices", 0) >= 1
                          and exp.get("follow_unanswered", 0) == 0, detail_exp)

    def sequence(self, exporter, importer):
        opts, tag = self.opts, self.tag
        slow = max(opts.timeout_s, 120)  # the first command also waits for imports (torch)
        # The importer's context exists before the exporter's control measures free memory.
        ready = importer.ask(slow, "ready")
        if not ready["ok"]:
            self.verdict("importer_starts", False, ready.get("error"))
            raise _Stop()
        setup = exporter.ask(slow, "setup", layout=self.layout, size=self.size, seed=SEED_FIRST,
                             runtime_base=self.runtime_base)
        if setup.get("skip"):
            raise _Skip(f"the exporter cannot run here: {setup.get('error')}")
        if not setup["ok"]:
            self.verdict("exporter_setup", False, setup.get("error"))
            raise _Stop()
        self.chunks = setup["chunks"]
        base = setup["base"]
        handles = setup["handles"]
        first = bytes.fromhex(handles[0]["hex"])
        detail = (f"{mib(self.size)} at {base:#x} in {self.chunks} chunk(s); handles "
                  f"{', '.join(h['name'] + ' via ' + h['api'] for h in handles)}; "
                  f"VMM2 handle: {first[:4] == b'VMM2'}")
        for key in ("chunk_size", "posix_fd_requested", "saver_preloaded", "is_vmm",
                    "vmm_detail", "mapping", "torch"):
            if key in setup:
                value = setup[key]
                detail += f"; {key} {[hex(v) for v in value] if key == 'mapping' else value}"
        ok = self.chunks >= 1 and setup.get("is_vmm", True)
        self.verdict("exporter_setup", ok, detail)
        for note in setup.get("notes", []):
            self.checks.info(f"{tag}.exporter_note", note)
        if self.exporter_role == "exporter-saver":
            if self.runtime_base and handles[0].get("runtime_unavailable"):
                self.checks.skip(f"{tag}.runtime_ipc_get_handle",
                                 f"the runtime API cannot run here: {handles[0]['runtime_error']}")
            elif self.runtime_base and "runtime_error" in handles[0]:
                self.verdict("runtime_ipc_get_handle", False, handles[0]["runtime_error"])
            elif self.runtime_base:
                self.verdict("runtime_ipc_get_handle", True, "cudaIpcGetMemHandle on the tensor")
        control = setup["control"]
        freed = control["settled"] - control["before"]
        at_once = control["after"] - control["before"]
        self.verdict("control_pause_frees_without_importer", freed >= self.size - self.slack,
                     f"a pause before any export freed {mib(freed)} ({mib(at_once)} at once) of "
                     f"{mib(self.size)}; slack {mib(self.slack)}")
        if not ok:
            raise _Stop()

        opened = importer.ask(slow, "open", handles=handles, size=self.size, seed=SEED_FIRST)
        if not opened["ok"]:
            self.verdict("import_reads_pattern", False, opened.get("error"))
            raise _Stop()
        ptrs = opened["ptrs"]
        reads = opened["reads"]
        self.verdict("import_reads_pattern", all(r["ok"] for r in reads.values())
                     and len(reads) == len(handles),
                     "; ".join(f"{n} at {ptrs[n]:#x} ({opened['apis'][n]}): {r['detail']}"
                               for n, r in reads.items())
                     + (f"; errors: {opened['errors']}" if opened["errors"] else ""))
        if self.runtime_base and self.exporter_role == "exporter-saver":
            runtime_open = [e for e in opened["errors"] if "runtime" in e]
            if handles[0]["api"] != "runtime":
                self.checks.skip(f"{tag}.runtime_ipc_open_handle",
                                 "the exporter's base handle did not come from the runtime API")
            elif runtime_open and ("raised" in runtime_open[0]
                                   or "not installed" in runtime_open[0]):
                self.checks.skip(f"{tag}.runtime_ipc_open_handle",
                                 f"the runtime API cannot run here: {runtime_open[0]}")
            else:
                self.verdict("runtime_ipc_open_handle", opened["apis"].get("base") == "runtime",
                             runtime_open[0] if runtime_open else
                             f"cudaIpcOpenMemHandle: {ptrs['base']:#x}")
        self.verdict("graph_replay_before_pause", opened["replay"]["ok"],
                     opened["replay"]["detail"])

        paused = exporter.ask(opts.timeout_s, "pause")
        if not paused["ok"]:
            self.verdict("pause", False, paused.get("error"))
            raise _Stop()
        freed = paused["settled"] - paused["before"]
        at_once = paused["after"] - paused["before"]
        self.checks.measure(f"{tag}.pause_seconds", f"{paused['seconds']:.3f}")
        self.verdict("pause_frees_memory", freed >= self.size - self.slack,
                     f"free memory went up by {mib(freed)} ({mib(at_once)} at once; noise before "
                     f"{mib(paused['noise'])}) for {mib(self.size)} paused; slack "
                     f"{mib(self.slack)}; pause took {paused['seconds']:.3f} s")

        resumed = exporter.ask(opts.timeout_s, "resume", seed=SEED_RESUMED)
        if not resumed["ok"]:
            self.verdict("resume", False, resumed.get("error"))
            raise _Stop()
        self.checks.measure(f"{tag}.resume_seconds", f"{resumed['seconds']:.3f}")
        self.verdict("resume", resumed["same_address"],
                     f"resumed at the same address: {resumed['same_address']}; took "
                     f"{resumed['seconds']:.3f} s; free memory went down by "
                     f"{mib(resumed['before'] - resumed['after'])}")

        candidates = [SEED_FIRST, SEED_RESUMED]
        checked = importer.ask(opts.timeout_s, "check", seed=SEED_RESUMED, candidates=candidates)
        if not checked["ok"]:
            self.verdict("importer_reads_new_bytes", False, checked.get("error"))
            raise _Stop()
        reads = checked["reads"]
        self.verdict("importer_reads_new_bytes", all(r["ok"] for r in reads.values()),
                     "same pointers, no new open; " + "; ".join(
                         f"{n}: {r['detail']}" for n, r in reads.items()))
        self.verdict("graph_replay_after_resume", checked["replay"]["ok"],
                     f"graph captured before the pause: {checked['replay']['detail']}")

        wrote = importer.ask(opts.timeout_s, "write", seed=SEED_IMPORTER)
        if not wrote["ok"]:
            self.verdict("exporter_reads_importer_bytes", False,
                         f"importer write: {wrote.get('error')}")
        else:
            seen = exporter.ask(opts.timeout_s, "expect", seed=SEED_IMPORTER,
                                candidates=[SEED_RESUMED, SEED_IMPORTER])
            self.verdict("exporter_reads_importer_bytes", seen["ok"],
                         seen.get("detail") or seen.get("error"))

        new = exporter.ask(opts.timeout_s, "handle")
        if not new["ok"]:
            self.verdict("new_handle_same_pointer", False, new.get("error"))
        else:
            again = importer.ask(opts.timeout_s, "reopen", hex_handle=new["hex"])
            if not again["ok"]:
                self.verdict("new_handle_same_pointer", False, again.get("error"))
            else:
                closing = f"; {again['close_error']}" if again["close_error"] else ""
                self.verdict("new_handle_same_pointer",
                             again["ptr"] == again["old"] and not again["close_error"],
                             f"new handle opened at {again['ptr']:#x}, old open at "
                             f"{again['old']:#x}{closing}")

        closed = importer.ask(opts.timeout_s, "close")
        self.verdict("close", closed["ok"], closed.get("error") or "every open closed")


def wait_stopped(pid, seconds=5.0):
    """True once the kernel reports `pid` stopped ('T' in /proc/<pid>/stat)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
                text = stat.read()
            if text[text.rindex(")") + 2] == "T":
                return True
        except (OSError, ValueError, IndexError):
            return False
        time.sleep(0.005)
    return False


class StoppedImporterScenario(Scenario):
    """Follow with a stopped importer (issue 24): the exporter pauses and resumes many 2 MiB
    chunks (one cuMemUnmap and one cuMemMap each) while the importer is SIGSTOPped. The pause and
    the resume must cost about one VMMIPC_TIMEOUT_MS in all (the importer then lags and is not
    waited for again), not one per chunk; continued, the importer catches up by itself and reads
    the resumed bytes at its old pointers, without a new open."""

    def judge_stats(self, exporter, importer):
        exp, exp_report = follow_stats(exporter.stderr_text())
        imp, imp_report = follow_stats(importer.stderr_text())
        chunks = getattr(self, "chunks", None)
        if chunks is None:
            return
        self.checks.check(f"{self.tag}.importer_follow_stats",
                          imp_report and imp.get("follow_pauses") == chunks
                          and imp.get("follow_resumes") == chunks,
                          f"importer {imp}; expected follow_pauses = follow_resumes = {chunks}")
        self.checks.check(f"{self.tag}.exporter_names_the_importer_once",
                          exp_report and exp.get("follow_unanswered") == 1,
                          f"exporter {exp}; expected follow_unanswered = 1")

    def sequence(self, exporter, importer):
        opts = self.opts
        slow = max(opts.timeout_s, 120)
        timeout_s = int(self.env_exporter["VMMIPC_TIMEOUT_MS"]) / 1000.0
        if not importer.ask(slow, "ready")["ok"]:
            raise _Stop()
        setup = exporter.ask(slow, "setup", layout="2m", size=self.size, seed=SEED_FIRST,
                             runtime_base=False)
        if setup.get("skip"):
            raise _Skip(f"the exporter cannot run here: {setup.get('error')}")
        if not setup["ok"]:
            self.verdict("exporter_setup", False, setup.get("error"))
            raise _Stop()
        self.chunks = setup["chunks"]
        opened = importer.ask(slow, "open", handles=setup["handles"], size=self.size,
                              seed=SEED_FIRST)
        if not opened["ok"] or not all(r["ok"] for r in opened["reads"].values()):
            self.verdict("import_reads_pattern", False, opened.get("error") or opened["reads"])
            raise _Stop()
        pid = importer.proc.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            if not wait_stopped(pid):
                self.verdict("importer_stopped", False, f"pid {pid} did not stop")
                raise _Stop()
            paused = exporter.ask(slow, "pause")
            resumed = exporter.ask(slow, "resume", seed=SEED_RESUMED)
        finally:
            os.kill(pid, signal.SIGCONT)
        if not paused["ok"] or not resumed["ok"]:
            self.verdict("pause_and_resume", False, paused.get("error") or resumed.get("error"))
            raise _Stop()
        self.checks.measure(f"{self.tag}.pause_seconds", f"{paused['seconds']:.3f}")
        self.checks.measure(f"{self.tag}.resume_seconds", f"{resumed['seconds']:.3f}")
        bound = 2 * timeout_s + 5
        self.verdict("pause_waits_about_one_timeout",
                     timeout_s * 0.8 <= paused["seconds"] < bound,
                     f"{self.chunks} chunks paused in {paused['seconds']:.3f} s with the importer "
                     f"stopped; VMMIPC_TIMEOUT_MS {timeout_s * 1000:.0f}; bound {bound:.0f} s "
                     f"(one wait per chunk would be {self.chunks * timeout_s:.0f} s)")
        self.verdict("resume_does_not_wait_for_a_lagging_importer", resumed["seconds"] < bound,
                     f"resumed in {resumed['seconds']:.3f} s with the importer still stopped")
        # The last chunk is the last one caught up (the backlog goes by address).
        start = time.monotonic()
        peeked = {}
        while time.monotonic() - start < 60:
            peeked = importer.ask(slow, "peek", seed=SEED_RESUMED,
                                  candidates=[SEED_FIRST, SEED_RESUMED])["read"]
            if peeked["ok"]:
                break
            time.sleep(0.005)
        caught_up_s = time.monotonic() - start
        self.checks.measure(f"{self.tag}.catch_up_seconds", f"{caught_up_s:.3f}")
        checked = importer.ask(slow, "check", seed=SEED_RESUMED,
                               candidates=[SEED_FIRST, SEED_RESUMED])
        reads = checked.get("reads", {})
        caught_up = peeked["ok"] and bool(reads) and all(r["ok"] for r in reads.values())
        self.verdict("importer_catches_up", caught_up,
                     f"after SIGCONT, the last chunk read the resumed bytes after "
                     f"{caught_up_s:.3f} s; then the whole check: " + "; ".join(
                         f"{n}: {r['detail']}" for n, r in reads.items()))
        closed = importer.ask(opts.timeout_s, "close")
        self.verdict("close", closed["ok"], closed.get("error") or "every open closed")


# --- environment -----------------------------------------------------------------------------


def preload_entries(value):
    return [p for p in value.replace(" ", ":").split(":") if p]


def base_env():
    """The parent's environment for the children: no torch_memory_saver preload, stats on."""
    env = dict(os.environ)
    kept = [p for p in preload_entries(env.get("LD_PRELOAD", "")) if "torch_memory_saver" not in p]
    env["LD_PRELOAD"] = ":".join(kept)
    env["VMMIPC_STATS"] = "1"
    for name in ("LOCAL_RANK", "RANK"):
        env.pop(name, None)
    return env


def with_follow(env, follow, rank):
    """Follow is vmmipc's default: the follow runs set nothing; the baseline sets it off."""
    env = dict(env, VMMIPC_RANK=str(rank))
    if follow:
        env.pop("VMMIPC_FOLLOW", None)
    else:
        env["VMMIPC_FOLLOW"] = "0"
    return env


def vmmipc_library():
    return next((p for p in preload_entries(os.environ.get("LD_PRELOAD", ""))
                 if "libvmmipc" in os.path.basename(p)), None)


def library_knows_follow(path):
    try:
        with open(path, "rb") as lib:
            data = lib.read()
    except OSError as exc:
        return f"cannot read {path}: {exc}"
    return ("yes (VMMIPC_FOLLOW is in the library)" if b"VMMIPC_FOLLOW" in data else
            "NO: the library has no VMMIPC_FOLLOW variable, the follow checks will fail")


def find_wheel(opts):
    for candidate in (opts.wheel, os.environ.get("MEMORY_SAVER_WHEEL")):
        if candidate:
            return candidate if os.path.isfile(candidate) else None
    found = sorted(glob.glob(os.path.join(REPO, ".whl", "torch_memory_saver-*.whl")))
    return found[-1] if found else None


def install_wheel(wheel, target):
    """pip install --no-deps --no-index --target; a plain unzip when pip is not there."""
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
           "--disable-pip-version-check", "--quiet", "--target", target, wheel]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)
        if out.returncode == 0:
            return "pip install --no-deps --target"
        why = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["?"]
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = [str(exc)]
    with zipfile.ZipFile(wheel) as archive:  # a wheel is a zip of the installed tree
        archive.extractall(target)
    return f"unzipped (pip failed: {why[0]})"


def prepare_saver(opts, env, folder):
    """(exporter env, description) for the torch_memory_saver part, or raises _Skip."""
    env = dict(env)
    if importlib.util.find_spec("torch") is None:
        raise _Skip("torch is not installed")
    how = "installed"
    if importlib.util.find_spec("torch_memory_saver") is None:
        wheel = find_wheel(opts)
        if wheel is None:
            raise _Skip("torch_memory_saver is not installed and no wheel was found (--wheel, "
                        "MEMORY_SAVER_WHEEL, or .whl/torch_memory_saver-*.whl in the repository)")
        target = os.path.join(folder, "site")
        how = f"{os.path.basename(wheel)} {install_wheel(wheel, target)} into {target}"
        env["PYTHONPATH"] = os.pathsep.join(p for p in (target, env.get("PYTHONPATH", "")) if p)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)  # torch_memory_saver refuses expandable segments
    probe = subprocess.run([sys.executable, "-c", SAVER_PROBE.format(stem=SAVER_STEM)],
                           env=env, capture_output=True, text=True, timeout=300, check=False)
    so = next((l.split(" ", 1)[1] for l in probe.stdout.splitlines() if l.startswith("SO ")), None)
    if probe.returncode != 0 or not so:
        raise _Skip(f"cannot find torch_memory_saver's preload library: "
                    f"{(probe.stderr.strip().splitlines() or ['?'])[-1]}")
    found = {l.split(" ", 1)[0]: l.split(" ", 1)[1] for l in probe.stdout.splitlines()
             if " " in l}
    version = found.get("VERSION", "?")
    missing, libdirs = found.get("MISSING", "").strip(), found.get("LIBDIRS", "").strip()
    if libdirs:
        env["LD_LIBRARY_PATH"] = ":".join(p for p in (libdirs, env.get("LD_LIBRARY_PATH")) if p)
    loader = (f"; the loader did not find {missing}: found in {libdirs or 'nothing under torch'}"
              f"{', added to LD_LIBRARY_PATH' if libdirs else ''}" if missing else "")
    others = preload_entries(env.get("LD_PRELOAD", ""))
    # Colons: torch_memory_saver splits LD_PRELOAD on ':' and wants exactly one entry of its own.
    order = [so] + others if opts.saver_order == "saver-first" else others + [so]
    env["LD_PRELOAD"] = ":".join(order)
    return env, f"{how}; torch {version}; exporter LD_PRELOAD={env['LD_PRELOAD']}{loader}"


def gpu_layout(opts):
    """(exporter device, importer device, text) or raises _Skip."""
    cu = Driver()
    err, _, name = cu.call("cuInit", 0)
    if err:
        raise _Skip(f"no CUDA device: cuInit: {name}")
    err, count, name = cu.call("cuDeviceGetCount")
    if err or not count:
        raise _Skip(f"no CUDA device: cuDeviceGetCount: {name}, {count}")
    count = int(count)
    if opts.importer_device is not None:
        if opts.importer_device >= count:
            raise _Skip(f"--importer-device {opts.importer_device}: only {count} GPUs")
        return 0, opts.importer_device, f"{count} GPUs; importer device chosen by the option"
    if count >= 2:
        _, dev1, _ = cu.call("cuDeviceGet", 1)
        _, dev0, _ = cu.call("cuDeviceGet", 0)
        err, can, name = cu.call("cuDeviceCanAccessPeer", dev1, dev0)
        if not err and int(can):
            return 0, 1, f"{count} GPUs: exporter on GPU 0, importer on GPU 1 (peer access)"
        return 0, 0, f"{count} GPUs but GPU 1 cannot access GPU 0 ({name}, {can}): both on GPU 0"
    return 0, 0, "1 GPU: exporter and importer both on GPU 0"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="raw,saver,stopped",
                        help="comma list of: raw, saver, stopped")
    parser.add_argument("--stopped-chunks", type=int, default=1024,
                        help="2 MiB chunks of the stopped part")
    parser.add_argument("--stopped-timeout-ms", type=int, default=1000,
                        help="VMMIPC_TIMEOUT_MS of the stopped part")
    parser.add_argument("--layouts", default="2m,32m",
                        help="raw part's chunk layouts, comma list of: " + ", ".join(LAYOUTS))
    parser.add_argument("--no-baseline", action="store_true",
                        help="leave out the runs without VMMIPC_FOLLOW")
    parser.add_argument("--size-mib", type=int, default=64)
    parser.add_argument("--slack-mib", type=int, default=8,
                        help="how much less than the size the freed memory may be")
    parser.add_argument("--importer-device", type=int, default=None,
                        help="default: 1 when two GPUs with peer access, else 0")
    parser.add_argument("--timeout-s", type=float, default=60, help="per command")
    parser.add_argument("--wheel", default=None, help="torch_memory_saver wheel")
    parser.add_argument("--saver-order", choices=("saver-first", "vmmipc-first"),
                        default="saver-first", help="order of the two preloads (saver part)")
    parser.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    parser.add_argument("--device", type=int, default=0, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.role:
        return child_main(opts.role, opts.device)

    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, _terminate)
    checks = Checks()
    parts = [p for p in opts.parts.split(",") if p]
    layouts = [l for l in opts.layouts.split(",") if l]
    bad = [p for p in parts if p not in ("raw", "saver", "stopped")] + [l for l in layouts if l not in LAYOUTS]
    if bad:
        parser.error(f"unknown part or layout: {', '.join(bad)}")
    size = opts.size_mib * MIB
    if opts.size_mib < 8 or any(size % LAYOUTS[l][0] for l in layouts):
        parser.error(f"--size-mib {opts.size_mib}: at least 8 and a multiple of every layout's "
                     f"chunk size")

    def skip_all(why):
        print(f"SKIP: {why}", flush=True)
        checks.skip("memory_saver_check", why)
        print(f"SUMMARY memory_saver_check: {checks.passed} PASS, {checks.failed} FAIL, "
              f"{checks.skipped} SKIP", flush=True)
        return SKIP

    try:
        load_driver_module()
    except Exception as exc:  # pylint: disable=broad-except
        return skip_all(f"cuda.bindings is not installed ({type(exc).__name__}: {exc})")
    lib = vmmipc_library()
    if lib is None:
        return skip_all("libvmmipc.so is not in LD_PRELOAD")
    try:
        opts.exporter_device, opts.importer_device, gpus = gpu_layout(opts)
    except _Skip as exc:
        return skip_all(str(exc))
    checks.info("gpus", gpus)
    checks.info("library", f"{lib}: {library_knows_follow(lib)}")
    if os.environ.get("VMMIPC_FOLLOW") == "0":
        checks.info("note", "VMMIPC_FOLLOW=0 is in this environment: the harness removes it in "
                            "each child of the follow runs (follow is the default)")

    env = base_env()
    folder = tempfile.mkdtemp(prefix="vmmipc-saver-")
    try:
        if "raw" in parts:
            runs = [(layout, True) for layout in layouts]
            if not opts.no_baseline:
                runs.append((layouts[0], False))
            for layout, follow in runs:
                Scenario(checks, opts, f"raw-{layout}", "exporter-raw", layout, follow,
                         with_follow(env, follow, 0), with_follow(env, follow, 1),
                         runtime_base=False).run(folder)
        if "stopped" in parts:
            stopped_env = dict(env, VMMIPC_TIMEOUT_MS=str(opts.stopped_timeout_ms))
            scenario = StoppedImporterScenario(
                checks, opts, "stopped-importer", "exporter-raw", "2m", True,
                with_follow(stopped_env, True, 0), with_follow(stopped_env, True, 1),
                runtime_base=False)
            scenario.size = opts.stopped_chunks * 2 * MIB
            scenario.run(folder)
        if "saver" in parts:
            try:
                saver_env, how = prepare_saver(opts, env, folder)
            except _Skip as exc:
                checks.skip("saver", str(exc))
            else:
                checks.info("saver.setup", how)
                for follow in (True,) if opts.no_baseline else (True, False):
                    Scenario(checks, opts, "saver", "exporter-saver", "saver", follow,
                             with_follow(saver_env, follow, 0), with_follow(env, follow, 1),
                             runtime_base=True).run(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"SUMMARY memory_saver_check: {checks.passed} PASS, {checks.failed} FAIL, "
          f"{checks.skipped} SKIP", flush=True)
    if checks.failed:
        return 1
    return 0 if checks.passed else SKIP


if __name__ == "__main__":
    sys.exit(main())
