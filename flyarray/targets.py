"""Compile any Triton kernel for any target from a CPU-only machine, and summarize its ISA.

Triton cross-compiles: ``triton.compile(ASTSource(...), target=GPUTarget(...))``
needs no GPU. This module is what ``fa.inspect`` and the CI corpus use to prove
that every kernel builds for MI350 (gfx950), MI300 (gfx942) and Hopper (sm_90),
which matrix instructions it uses, and whether it spills.
"""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import tempfile
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from .diskcache import triton_cache_scope

TARGETS = {
    "gfx950": GPUTarget("hip", "gfx950", 64),
    "gfx942": GPUTarget("hip", "gfx942", 64),
    "sm_90": GPUTarget("cuda", 90, 32),
}

# Matrix instructions worth naming: AMD MFMA (incl. scaled MX MFMA on gfx950),
# NVIDIA warpgroup MMA (wgmma in PTX, HGMMA/QGMMA in SASS) and the older mma.sync.
_MATRIX_RE = re.compile(r"\b(v_mfma\w*|v_smfmac\w*|wgmma\.mma_async[\w.]*|mma\.sync[\w.]*)")


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """One kernel specialization: what ``triton.compile`` needs besides the target.

    ``signature`` maps every argument name to a Triton type string ('*fp32',
    'i32', 'fp32', 'constexpr', ...); ``constexprs`` gives the value of every
    'constexpr' argument.
    """
    name: str
    fn: Any  # a triton JITFunction
    signature: dict
    constexprs: dict
    num_warps: int = 4
    num_stages: int = 3
    # Integer arguments a real launch would see divisible by 16 (Triton specializes them, like
    # 16-byte-aligned pointers, which are always marked): without the hint nothing is
    # vectorized or pipelined and the report would describe a kernel that never runs.
    divisible: tuple = ()
    # AMD backend compile options (waves_per_eu, matrix_instr_nonkdim, ...): passed to hip
    # targets only, as the launch paths pass them only on AMD GPUs (CUDA rejects them).
    amd_options: dict = dataclasses.field(default_factory=dict, hash=False)
    # NVIDIA backend compile options (maxnreg): passed to cuda targets only, as launches pass them.
    nv_options: dict = dataclasses.field(default_factory=dict, hash=False)


# The AMD backend options a config table may carry beside num_warps/num_stages (Triton's
# HIPOptions fields; kpack is left out: gfx950 deprecates it and Triton overrides it to 1).
AMD_OPTIONS = ("waves_per_eu", "matrix_instr_nonkdim", "schedule_hint")


def amd_launch_options(cfg: dict, arch: str) -> dict:
    """The AMD-only compile options in ``cfg`` for a launch on ``arch``: none off AMD (a CUDA launch
    and the interpreter reject or ignore them; the H200 runs Triton 3.6, whose NVIDIA backend raises
    on an unknown keyword)."""
    if not str(arch).startswith("gfx"):
        return {}
    return {k: cfg[k] for k in AMD_OPTIONS if k in cfg}


@dataclasses.dataclass
class KernelReport:
    name: str
    target: str
    triton_source: str
    asm: str  # AMDGCN for hip targets, PTX for cuda
    matrix_instructions: list
    registers: int  # VGPRs on AMD, registers per thread on NVIDIA
    shared_bytes: int  # LDS on AMD, shared memory on NVIDIA
    spills: int  # scratch bytes (AMD) / stack beyond the PTX's local arrays + spill stores (NVIDIA); 0 is required
    num_warps: int

    def summary(self) -> dict:
        d = dataclasses.asdict(self)
        del d["asm"], d["triton_source"]
        return d


_REPORTS: dict = {}  # compile key -> KernelReport: a process compiles and disassembles a spec once per target


@triton.jit
def _probe():   # what triton.jit builds in this process: a JITFunction, or the interpreter's function
    pass


def check_cross_compiling(where: str) -> None:
    """Refuse, naming the cause, where Triton cannot compile: with TRITON_INTERPRET=1 set when the kernels
    were defined, triton.jit builds interpreter functions, which run on the CPU and have nothing to compile."""
    if not isinstance(_probe, triton.runtime.jit.JITFunction):
        raise RuntimeError(f"{where}: TRITON_INTERPRET=1 is set, so triton.jit built interpreter functions, which "
                           "cannot be compiled for a target; run without TRITON_INTERPRET to cross-compile "
                           "(the CPU backend runs kernels in the interpreter without it)")


def compile_for(spec: KernelSpec, target: str) -> KernelReport:
    """Compile ``spec`` for ``target`` ('gfx950', 'gfx942' or 'sm_90') on any machine. A spec compiled
    before in this process (the same kernel source, signature, constexprs and options) is not compiled
    again: Triton's cache would skip the compile, but not the disassembly the report reads."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; known: {sorted(TARGETS)}")
    check_cross_compiling("compile_for")
    key = _report_key(spec, target)
    report = _REPORTS.get(key) if key is not None else None
    if report is None:
        report = _compile_report(spec, target)
        if key is not None:
            _REPORTS[key] = report
    return dataclasses.replace(report)  # a copy: a caller may change its report


def _report_key(spec: KernelSpec, target: str):
    """Everything that decides ``spec``'s compile for ``target``, or None where a value cannot be a key."""
    try:
        key = (target, spec.name, spec.fn.cache_key, tuple(spec.signature.items()),
               tuple(sorted(spec.constexprs.items())), spec.num_warps, spec.num_stages, tuple(spec.divisible),
               tuple(sorted(spec.amd_options.items())), tuple(sorted(spec.nv_options.items())))
        hash(key)
    except (TypeError, AttributeError):
        return None
    return key


def _compile_report(spec: KernelSpec, target: str) -> KernelReport:
    src = _source_class(spec.fn)(spec.fn, signature=spec.signature, constexprs=spec.constexprs,
                                 attrs=_launch_attrs(spec))
    opts = {"num_warps": spec.num_warps, "num_stages": spec.num_stages}
    opts.update(spec.amd_options if TARGETS[target].backend == "hip" else spec.nv_options)
    with triton_cache_scope():
        compiled = triton.compile(src, target=TARGETS[target], options=opts)
    if TARGETS[target].backend == "hip":
        return _amd_report(spec, target, compiled)
    return _nvidia_report(spec, target, compiled)


def _source_class(fn):
    """Triton's compile source for ``fn``: Gluon kernels (explicit layouts) have their own."""
    if getattr(fn, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource
        return GluonASTSource
    return ASTSource


def _launch_attrs(spec: KernelSpec) -> dict:
    return {(i,): [["tt.divisibility", 16]] for i, (name, ty) in enumerate(spec.signature.items())
            if ty.startswith("*") or name in spec.divisible}


def _source_of(spec: KernelSpec) -> str:
    return getattr(spec.fn, "src", "") or ""


def _amd_report(spec, target, compiled) -> KernelReport:
    asm = compiled.asm["amdgcn"]
    return KernelReport(
        name=spec.name, target=target, triton_source=_source_of(spec), asm=asm,
        matrix_instructions=sorted(set(m.group(1) for m in _MATRIX_RE.finditer(asm))),
        registers=_last_int(r"\.vgpr_count:\s+(\d+)", asm),
        shared_bytes=max(int(compiled.metadata.shared), _last_int(r"LDSByteSize: (\d+)", asm)),
        spills=_last_int(r"ScratchSize: (\d+)", asm) + _last_int(r"\.vgpr_spill_count:\s+(\d+)", asm),
        num_warps=spec.num_warps,
    )


def _nvidia_report(spec, target, compiled) -> KernelReport:
    ptx = compiled.asm["ptx"]
    usage = _cuobjdump(compiled.asm["cubin"], "--dump-resource-usage")
    sass = _cuobjdump(compiled.asm["cubin"], "--dump-sass")
    matrix = set(m.group(1) for m in _MATRIX_RE.finditer(ptx))
    matrix |= set(re.findall(r"\b([HQ]GMMA\.[\w.]+|HMMA\.[\w.]+)", sass))
    return KernelReport(
        name=spec.name, target=target, triton_source=_source_of(spec), asm=ptx,
        matrix_instructions=sorted(matrix),
        registers=_last_int(r"REG:(\d+)", usage),
        shared_bytes=max(int(compiled.metadata.shared), _last_int(r"SHARED:(\d+)", usage)),
        spills=_nvidia_spills(ptx, usage, sass),
        num_warps=spec.num_warps,
    )


def _nvidia_spills(ptx: str, usage: str, sass: str) -> int:
    """Bytes of stack beyond the local arrays the PTX itself declares, plus the SASS local stores when it
    declares none. libdevice's sin/cos keep a 28-byte table for the huge-argument reduction in a PTX
    local depot (stores to it are not spills; ptxas versions differ in whether STACK counts it)."""
    depot = sum(-(-int(n) // 8) * 8 for n in re.findall(r"__local_depot\d+\[(\d+)\]", ptx))  # 8-byte frames
    stack = _last_int(r"STACK:(\d+)", usage)
    return max(0, stack - depot) + (0 if depot else len(re.findall(r"\bSTL\b", sass)))


def _cuobjdump(cubin: bytes, flag: str) -> str:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return ""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        res = subprocess.run([tool, flag, f.name], capture_output=True, text=True)
    return res.stdout


def _last_int(pattern: str, text: str) -> int:
    found = re.findall(pattern, text)
    return int(found[-1]) if found else 0
