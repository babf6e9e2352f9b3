"""DLPack out: a realized array's buffer is a torch tensor, so its capsule is the tensor's.

The stream handshake is torch's: the consumer passes the stream it will use,
and torch makes that stream wait on ours before handing the capsule over.
"""
from __future__ import annotations


def export_dlpack(array, *, stream=None, max_version=None, dl_device=None, copy=None):
    tensor = array._tensor()
    if dl_device is not None and tuple(dl_device) != tuple(tensor.__dlpack_device__()):
        if copy is False:
            raise BufferError(f"copy=False, but the consumer asks for device {dl_device} and the data lives on "
                              f"{tensor.device}")
        if dl_device[0] != 1:  # kDLCPU = 1
            raise BufferError(f"cannot export to DLPack device {dl_device}")
        tensor, copy = tensor.cpu(), False
    if copy:
        tensor = tensor.clone()
    if max_version is None:
        return tensor.__dlpack__(stream=stream)
    try:
        return tensor.__dlpack__(stream=stream, max_version=max_version)
    except TypeError:  # an older torch without max_version
        return tensor.__dlpack__(stream=stream)
