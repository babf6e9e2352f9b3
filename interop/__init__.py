"""Bridges between flyarray and other frameworks, imported as ``flyarray.interop``.

``flyarray.interop.torch``: round trips, torch autograd ops backed by our kernels.
"""
