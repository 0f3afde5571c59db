#!/usr/bin/env python3
"""Not a timing: what the driver's own legacy IPC does with a handle taken at an interior
address of a cuMemAlloc allocation (docs/driver-behaviour.md, "Interior handles"). The parent
allocates 8 MiB, writes a different byte into each MiB, and takes handles at the base and at
base + 2 MiB + 4 KiB; a second process opens both and reports what each open returned: the two
pointers, whether they are equal, and the byte found at each returned pointer (which MiB of the
allocation it maps there). No vmmipc (run it without LD_PRELOAD). Needs cuda.bindings and a GPU.

  python3 tests/bench/legacy_interior_handle.py
Prints RESULT lines; exit 0 when every call worked, 77 when there is no GPU or binding."""
import multiprocessing as mp
import sys

MIB = 1 << 20
INTERIOR = 2 * MIB + 4096


def check(result, what):
    err = result[0]
    if int(err) != 0:
        raise RuntimeError("%s: %s" % (what, err))
    return result[1:] if len(result) > 2 else (result[1] if len(result) == 2 else None)


def importer(handles, queue):
    from cuda.bindings import driver as cu
    try:
        check(cu.cuInit(0), "cuInit")
        dev = check(cu.cuDeviceGet(0), "cuDeviceGet")
        ctx = check(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        out = {}
        for name, raw in handles.items():
            handle = cu.CUipcMemHandle()
            handle.reserved = raw
            ptr = check(cu.cuIpcOpenMemHandle(handle, 1), "cuIpcOpenMemHandle(%s)" % name)
            byte = bytearray(1)
            check(cu.cuMemcpyDtoH(byte, ptr, 1), "cuMemcpyDtoH")
            base, size = check(cu.cuMemGetAddressRange(ptr), "cuMemGetAddressRange")
            out[name] = (int(ptr), byte[0], int(base), int(size))
        queue.put(out)
    except Exception as exc:  # reported by the parent
        queue.put({"error": str(exc)})


def main():
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        print("SKIPPED: no cuda.bindings")
        return 77
    err, = cu.cuInit(0)
    if int(err) != 0:
        print("SKIPPED: cuInit: %s" % err)
        return 77
    dev = check(cu.cuDeviceGet(0), "cuDeviceGet")
    ctx = check(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    base = check(cu.cuMemAlloc(8 * MIB), "cuMemAlloc")
    for mib in range(8):
        check(cu.cuMemsetD8(int(base) + mib * MIB, 0x10 + mib, MIB), "cuMemsetD8")
    check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    handles = {}
    for name, offset in (("base", 0), ("interior", INTERIOR)):
        handle = check(cu.cuIpcGetMemHandle(int(base) + offset), "cuIpcGetMemHandle(%s)" % name)
        handles[name] = bytes(handle.reserved)
    print("RESULT exporter allocation 0x%x + 8 MiB; handles at +0 and +0x%x; handles equal: %s"
          % (int(base), INTERIOR, handles["base"] == handles["interior"]))
    queue = mp.get_context("spawn").Queue()
    child = mp.get_context("spawn").Process(target=importer, args=(handles, queue))
    child.start()
    out = queue.get(timeout=60)
    child.join(60)
    if "error" in out:
        print("RESULT importer failed: %s" % out["error"])
        return 1
    for name in ("base", "interior"):
        ptr, byte, rbase, rsize = out[name]
        print("RESULT open(%s handle) -> 0x%x, byte there 0x%02x (MiB %d of the allocation), "
              "its range 0x%x + %d MiB" % (name, ptr, byte, byte - 0x10, rbase, rsize // MIB))
    same = out["base"][0] == out["interior"][0]
    print("RESULT the interior handle's open returned %s" % (
        "the allocation's base (the same pointer as the base handle's)" if same else
        "another pointer (0x%x from the base handle's)" % (out["interior"][0] - out["base"][0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
