"""What the driver-level benchmark scripts share (cuda.bindings, no vmmipc): the result check,
a current primary context, and the VMM allocation and access descriptions."""

from cuda.bindings import driver as drv

FD_TYPE = drv.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR


def ok(result, what):
    """The value of a cuda.bindings call's result tuple; RuntimeError naming `what` on failure."""
    err = result[0] if isinstance(result, tuple) else result
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what}: {err.name}")
    return result[1] if isinstance(result, tuple) and len(result) > 1 else None


def primary_context(device):
    """cuInit, then makes `device`'s primary context current; returns it."""
    ok(drv.cuInit(0), "cuInit")
    dev = ok(drv.cuDeviceGet(device), "cuDeviceGet")
    ctx = ok(drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    ok(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return ctx


def vmm_prop(device, exportable=True):
    """Pinned memory of `device`, exportable as a POSIX fd unless told otherwise."""
    prop = drv.CUmemAllocationProp()
    prop.type = drv.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device
    if exportable:
        prop.requestedHandleTypes = FD_TYPE
    return prop


def access_desc(device):
    """Read-write access for `device`."""
    desc = drv.CUmemAccessDesc()
    desc.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = device
    desc.flags = drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    return desc


def ipc_handle_bytes(handle):
    """The 64 bytes of a CUipcMemHandle, whatever type the bindings give its `reserved`."""
    reserved = handle.reserved
    if isinstance(reserved, (bytes, bytearray)):
        return bytes(reserved)
    return bytes(int(x) & 0xFF for x in reserved)
