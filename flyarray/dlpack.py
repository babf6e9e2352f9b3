"""DLPack out: a realized array's buffer is a torch tensor, so its capsule is the tensor's.

The stream handshake is torch's: the consumer passes the stream it will use,
and torch makes that stream wait on ours before handing the capsule over. When
the consumer's stream *is* the current one (what ``torch.from_dlpack`` passes) there
is nothing to wait for, and the capsule is made by torch's C function directly:
``Tensor.__dlpack__`` builds stream objects in Python on every call (several
microseconds on a GPU host), which a user pays on every result they take out.
"""
from __future__ import annotations

import ctypes

import torch

_HIP = torch.version.hip is not None
_LEGACY_DEFAULT = 0 if _HIP else 1  # the consumer's name for the default stream (torch/utils/dlpack.py)
_TO_VERSIONED = getattr(torch._C, "_to_dlpack_versioned", None)
_TO_UNVERSIONED = getattr(torch._C, "_to_dlpack", None)
_DEVICES: dict = {}  # torch.device -> torch's (DLDeviceType, index)


def dlpack_device(tensor: torch.Tensor):
    """``tensor.__dlpack_device__()``, computed once per device."""
    return device_of(tensor.device)


def device_of(device: torch.device):
    """The DLPack (device type, index) of ``device`` without a tensor on it: what a tensor there would
    answer (computed once per device from a zero-element tensor; a bare "cuda" is the current index)."""
    found = _DEVICES.get(device)
    if found is None:
        if device.type == "cuda" and device.index is None:
            return device_of(torch.device(device.type, torch.cuda.current_device()))
        found = _DEVICES[device] = torch.empty(0, device=device).__dlpack_device__()
    return found


def buffer_capsule(buffer: torch.Tensor, stream, max_version):
    """The capsule of a realized buffer for a consumer on ``stream``: made directly when no stream
    handshake is needed, else by torch's ``__dlpack__`` (which also raises for what it refuses)."""
    if _direct(buffer, stream):
        if max_version is not None and max_version[0] >= 1 and _TO_VERSIONED is not None:
            return _TO_VERSIONED(buffer)
        if max_version is None and _TO_UNVERSIONED is not None:
            return _TO_UNVERSIONED(buffer)
    if max_version is None or not _TORCH_MAX_VERSION:
        return buffer.__dlpack__(stream=stream)
    return buffer.__dlpack__(stream=stream, max_version=max_version)


def _direct(buffer, stream) -> bool:
    """Whether torch's ``__dlpack__`` would do nothing but make the capsule: a plain tensor (no grad,
    no conjugate or negative bit) on the CPU, or on the current GPU with the consumer's stream being
    the current stream (or -1: no synchronization asked)."""
    if buffer.requires_grad or buffer.is_conj() or buffer.is_neg() or buffer.layout is not torch.strided:
        return False
    if not buffer.is_cuda:
        return buffer.is_cpu and (stream is None or stream == -1)  # .device.type would cost 0.3 us per export
    if type(stream) is not int and stream is not None:
        return False
    index = buffer.device.index
    if index != torch._C._cuda_getDevice():
        return False
    if stream == -1:
        return True
    if stream is None or stream == _LEGACY_DEFAULT:
        return torch._C._cuda_getCurrentRawStream(index) == 0
    return stream not in (0, 1, 2) and torch._C._cuda_getCurrentRawStream(index) == stream


def _torch_takes_max_version() -> bool:
    import inspect
    return "max_version" in inspect.signature(torch.Tensor.__dlpack__).parameters  # torch >= 2.6


_TORCH_MAX_VERSION = _torch_takes_max_version()


def check_export_args(device: torch.device, stream, max_version):
    """``__dlpack__``'s stream and max_version as the DLPack protocol defines them, refused by name before any
    work: max_version a (major, minor) pair of ints; on the CPU no stream (None, or -1: no synchronization)."""
    if max_version is not None and not (isinstance(max_version, tuple) and len(max_version) == 2
                                        and all(type(v) is int for v in max_version)):
        raise TypeError(f"__dlpack__: max_version must be a (major, minor) tuple of ints, got {max_version!r}")
    if stream is not None and type(stream) is not int:
        raise TypeError(f"__dlpack__: stream must be an int or None, got {type(stream).__name__}")
    if stream is not None and stream != -1 and device.type == "cpu":
        raise BufferError(f"__dlpack__: stream={stream!r} for an array on the CPU: a CPU consumer passes None")


def check_dl_device(dl_device):
    """``__dlpack__``'s dl_device: None or a (device type, index) pair of ints (the DLPack protocol's)."""
    if dl_device is not None and not (isinstance(dl_device, tuple) and len(dl_device) == 2
                                      and all(isinstance(v, int) for v in dl_device)):
        raise TypeError(f"__dlpack__: dl_device must be a (device type, index) tuple of ints, got {dl_device!r}")


def export_dlpack(array, *, stream=None, max_version=None, dl_device=None, copy=None):
    tensor = array._tensor()
    copied = array._copied_view(tensor)
    if copy is False and copied:
        raise BufferError("copy=False, but this view has no memory of its own (DLPack has no strides for it, "
                          "e.g. a flip): exporting it needs a copy")
    if dl_device is not None and tuple(dl_device) != tuple(dlpack_device(tensor)):
        if copy is False:
            raise BufferError(f"copy=False, but the consumer asks for device {dl_device} and the data lives on "
                              f"{tensor.device}")
        if dl_device[0] != 1:  # kDLCPU = 1
            raise BufferError(f"cannot export to DLPack device {dl_device}")
        tensor, copy, copied = tensor.cpu(), False, True
    if copy:
        tensor, copied = tensor.clone(), True
    capsule = buffer_capsule(tensor, stream, max_version)
    return mark_copied(capsule) if copied else capsule


_IS_COPIED = 1 << 1   # DLPACK_FLAG_BITMASK_IS_COPIED (DLPack 1.0)


def mark_copied(capsule):
    """``capsule`` with its IS_COPIED flag set if it is versioned: the consumer owns this memory alone and may
    write it (torch makes its capsules with no flags). An unversioned capsule has no flags to set."""
    if _capsule_is_valid(capsule, b"dltensor_versioned"):
        # DLManagedTensorVersioned: version (8 bytes), manager_ctx, deleter, then uint64 flags at byte 24
        flags = ctypes.c_uint64.from_address(_capsule_pointer(capsule, b"dltensor_versioned") + 24)
        flags.value |= _IS_COPIED
    return capsule


# ---- DLPack in, from producers other than numpy and torch ----------------------------------------------------
# torch.from_dlpack aborts the whole process (a C++ exception past its binding: "Storage size calculation
# overflowed") on a capsule with negative strides, which any producer's flip or [::-1] view exports. So a capsule's
# strides are read before torch sees one (the DLTensor's layout is DLPack's stable C ABI), and such a view from a CPU
# producer goes through numpy's consumer instead (it takes them; creation._from_numpy then copies). Other views
# keep torch's consumer: zero copy, whatever read-only flag the producer sets (JAX's arrays), as before.
_KDL_CPU = 1


def numpy_of_cpu_producer(x):
    """``np.from_dlpack(x)`` for a producer whose data is in CPU memory, or None: on another device, or in a
    dtype numpy's consumer does not take (bfloat16, float8), where torch's consumer is the way in."""
    try:
        if tuple(x.__dlpack_device__())[0] != _KDL_CPU:
            return None
    except (AttributeError, TypeError, ValueError):
        return None
    import numpy as np
    try:
        return np.from_dlpack(x)
    except (BufferError, TypeError, ValueError, RuntimeError):
        return None


def has_negative_strides(x) -> bool:
    """Whether producer ``x`` exports a view with a negative stride (read from a capsule of its own, which its
    destructor frees unconsumed)."""
    try:
        capsule = x.__dlpack__(max_version=(1, 0))
    except TypeError:   # a producer older than DLPack 1.0's keywords
        capsule = x.__dlpack__()
    for name, tensor_offset in ((b"dltensor_versioned", 32), (b"dltensor", 0)):
        if _capsule_is_valid(capsule, name):
            tensor = _capsule_pointer(capsule, name) + tensor_offset   # DLManagedTensor(Versioned).dl_tensor
            ndim = ctypes.c_int32.from_address(tensor + 16).value
            strides = ctypes.c_void_p.from_address(tensor + 32).value   # NULL: compact row-major
            return bool(strides) and any(s < 0 for s in (ctypes.c_int64 * ndim).from_address(strides))
    return False


def _capsule_api():
    is_valid, pointer = ctypes.pythonapi.PyCapsule_IsValid, ctypes.pythonapi.PyCapsule_GetPointer
    is_valid.restype, is_valid.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
    pointer.restype, pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return is_valid, pointer


_capsule_is_valid, _capsule_pointer = _capsule_api()
