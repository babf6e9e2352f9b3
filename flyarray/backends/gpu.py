"""The gpu backend: generated Triton source compiled for the current CUDA or ROCm device."""
from __future__ import annotations

from triton.language.extra import libdevice

EXTERN_MATH = libdevice
