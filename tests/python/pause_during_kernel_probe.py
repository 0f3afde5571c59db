#!/usr/bin/env python3
"""What an importer gets when its exporter pauses memory while an importer kernel still reads it.

A measurement, not a check (issue 24, item 7). Two processes on one GPU, both preloaded with
libvmmipc.so: an EXPORTER (cuda.bindings) makes one VMM chunk and a legacy handle of it; an
IMPORTER opens it and launches a kernel (CuPy RawKernel) that reads it for --kernel-ms. While
that kernel runs, the exporter pauses (cuMemUnmap + cuMemRelease, the reservation kept), which
with VMMIPC_FOLLOW=1 makes the importer's follow thread unmap its mapping too. Printed (MEASURE
lines): how long the exporter's pause took, what the importer's cuCtxSynchronize returned, whether
the importer's context still works afterwards (a new allocation, a memset, a synchronize), and,
after the exporter's resume, what the importer reads at its old pointer. Each --modes entry
(follow, nofollow) runs in fresh processes.

Run: LD_PRELOAD=/path/to/libvmmipc.so python3 tests/python/pause_during_kernel_probe.py
Exit 0 when every mode ran to the end (whatever it measured), 1 when a process failed, 77 when
nothing could run (no cuda.bindings or CuPy, no GPU).
"""
import argparse
import json
import os
import subprocess
import sys
import time

SKIP = 77
CHUNK = 2 << 20
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

KERNEL = r"""
extern "C" __global__ void spin_read(const volatile unsigned int* p, unsigned long long n,
                                     long long cycles, unsigned long long* out) {
  const long long start = clock64();
  unsigned long long sum = 0, i = threadIdx.x;
  while (clock64() - start < cycles) { sum += p[i % n]; i += blockDim.x; }
  out[threadIdx.x] = sum;
}
"""


def say(obj):
    print("REPLY " + json.dumps(obj), flush=True)


def ok(result, what):
    err = result[0] if isinstance(result, tuple) else result
    from cuda.bindings import driver as drv  # pylint: disable=import-outside-toplevel
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what}: {err.name}")
    return result[1] if isinstance(result, tuple) and len(result) > 1 else None


def name_of(result):
    err = result[0] if isinstance(result, tuple) else result
    return err.name


def context():
    from cuda.bindings import driver as drv  # pylint: disable=import-outside-toplevel
    ok(drv.cuInit(0), "cuInit")
    dev = ok(drv.cuDeviceGet(0), "cuDeviceGet")
    ctx = ok(drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    ok(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return drv


def exporter():
    drv = context()
    from driver_calls import ipc_handle_bytes  # pylint: disable=import-outside-toplevel
    prop = drv.CUmemAllocationProp()
    prop.type = drv.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = 0
    prop.requestedHandleTypes = drv.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    desc = drv.CUmemAccessDesc()
    desc.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = 0
    desc.flags = drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    base = ok(drv.cuMemAddressReserve(CHUNK, 0, 0, 0), "cuMemAddressReserve")
    state = {}

    def create(value):
        handle = ok(drv.cuMemCreate(CHUNK, prop, 0), "cuMemCreate")
        ok(drv.cuMemMap(base, CHUNK, 0, handle, 0), "cuMemMap")
        ok(drv.cuMemSetAccess(base, CHUNK, [desc], 1), "cuMemSetAccess")
        ok(drv.cuMemsetD32(base, value, CHUNK // 4), "cuMemsetD32")
        ok(drv.cuCtxSynchronize(), "cuCtxSynchronize")
        state["handle"] = handle

    create(1)
    ipc = ok(drv.cuIpcGetMemHandle(base), "cuIpcGetMemHandle")
    say({"handle": ipc_handle_bytes(ipc).hex()})
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "pause":
            start = time.perf_counter()
            unmap = name_of(drv.cuMemUnmap(base, CHUNK))
            release = name_of(drv.cuMemRelease(state["handle"]))
            say({"pause_ms": (time.perf_counter() - start) * 1e3, "unmap": unmap,
                 "release": release})
        elif cmd == "resume":
            create(2)
            say({"ok": True})
        elif cmd == "exit":
            return 0
    return 0


def importer(kernel_ms):
    drv = context()
    import cupy  # pylint: disable=import-outside-toplevel
    import numpy  # pylint: disable=import-outside-toplevel
    line = sys.stdin.readline()
    raw = bytes.fromhex(line.strip())
    handle = drv.CUipcMemHandle()
    handle.reserved = raw
    lazy = drv.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
    ptr = int(ok(drv.cuIpcOpenMemHandle(handle, lazy), "cuIpcOpenMemHandle"))
    kernel = cupy.RawKernel(KERNEL, "spin_read")
    out = cupy.zeros(256, dtype=cupy.uint64)
    rate_khz = cupy.cuda.runtime.deviceGetAttribute(cupy.cuda.runtime.cudaDevAttrClockRate, 0)
    kernel((1,), (256,), (numpy.uint64(ptr), numpy.uint64(CHUNK // 4), numpy.int64(1000), out))
    cupy.cuda.runtime.deviceSynchronize()
    cycles = int(rate_khz) * kernel_ms
    kernel((1,), (256,), (numpy.uint64(ptr), numpy.uint64(CHUNK // 4), numpy.int64(cycles), out))
    say({"ptr": ptr, "launched": True, "clock_khz": int(rate_khz)})
    sys.stdin.readline()  # "sync": the exporter has paused
    start = time.perf_counter()
    synced = name_of(drv.cuCtxSynchronize())
    sync_ms = (time.perf_counter() - start) * 1e3
    after = {}
    for step, call in (("cuMemAlloc", lambda: drv.cuMemAlloc(4096)),):
        result = call()
        after[step] = name_of(result)
        if after[step] == "CUDA_SUCCESS":
            scratch = result[1]
            after["cuMemsetD32"] = name_of(drv.cuMemsetD32(scratch, 7, 1024))
            after["cuCtxSynchronize"] = name_of(drv.cuCtxSynchronize())
            drv.cuMemFree(scratch)
    say({"sync": synced, "sync_ms": sync_ms, "after": after})
    sys.stdin.readline()  # "read": the exporter has resumed
    word = numpy.zeros(1, dtype=numpy.uint32)
    read = name_of(drv.cuMemcpyDtoH(word.ctypes.data, ptr, 4))
    say({"read": read, "value": int(word[0])})
    sys.stdin.readline()
    return 0


class Child:
    def __init__(self, role, env, kernel_ms):
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", role,
                                      "--kernel-ms", str(kernel_ms)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, text=True)

    def send(self, text):
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def reply(self):
        for line in self.proc.stdout:
            if line.startswith("REPLY "):
                return json.loads(line[6:])
            sys.stderr.write(line)
        raise RuntimeError(f"child ended: {self.proc.wait()}")


def run_mode(mode, kernel_ms):
    env = dict(os.environ, VMMIPC_STATS="1")
    env.pop("VMMIPC_FOLLOW", None)
    if mode == "follow":
        env["VMMIPC_FOLLOW"] = "1"
    exp = Child("exporter", dict(env, VMMIPC_RANK="0"), kernel_ms)
    imp = Child("importer", dict(env, VMMIPC_RANK="1"), kernel_ms)
    try:
        handle = exp.reply()["handle"]
        imp.send(handle)
        launched = imp.reply()
        time.sleep(kernel_ms / 4000.0)  # the kernel is running (a quarter of its time)
        exp.send("pause")
        paused = exp.reply()
        imp.send("sync")
        synced = imp.reply()
        exp.send("resume")
        exp.reply()
        imp.send("read")
        read = imp.reply()
        imp.send("exit")
        exp.send("exit")
        codes = (imp.proc.wait(60), exp.proc.wait(60))
    except Exception as exc:  # pylint: disable=broad-except
        print(f"FAIL {mode}: {exc}", flush=True)
        for child in (exp, imp):
            child.proc.kill()
        return False
    print(f"MEASURE {mode}.pause_ms {paused['pause_ms']:.2f} (kernel {kernel_ms} ms, launched "
          f"{kernel_ms / 4:.0f} ms before; unmap {paused['unmap']}, release {paused['release']})")
    print(f"MEASURE {mode}.importer_sync {synced['sync']} after {synced['sync_ms']:.1f} ms")
    print(f"MEASURE {mode}.importer_context_after {synced['after']}")
    print(f"MEASURE {mode}.importer_reads_after_resume {read['read']} value {read['value']} "
          f"(1: the old memory, 2: the resumed one)")
    print(f"MEASURE {mode}.exit_codes importer {codes[0]} exporter {codes[1]}", flush=True)
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modes", default="follow,nofollow")
    parser.add_argument("--kernel-ms", type=int, default=2000)
    parser.add_argument("--role", choices=("exporter", "importer"))
    opts = parser.parse_args()
    if opts.role == "exporter":
        return exporter()
    if opts.role == "importer":
        return importer(opts.kernel_ms)
    try:
        import cupy  # pylint: disable=import-outside-toplevel,unused-import
        from cuda.bindings import driver  # pylint: disable=import-outside-toplevel,unused-import
    except ImportError as exc:
        print(f"SKIP: {exc}")
        return SKIP
    if "libvmmipc" not in os.environ.get("LD_PRELOAD", ""):
        print("SKIP: libvmmipc.so is not in LD_PRELOAD")
        return SKIP
    ran = [run_mode(mode, opts.kernel_ms) for mode in opts.modes.split(",") if mode]
    return 0 if all(ran) else 1


if __name__ == "__main__":
    sys.exit(main())
