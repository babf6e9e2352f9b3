"""Does Triton's interpreter work in this environment?

Triton 3.6's interpreter breaks under numpy >= 2.4 (it converts 1-element arrays
to Python ints, which numpy now refuses). The H200 machine has exactly that pair,
so there the CPU-interpreter tests are skipped and only CI (Triton 3.9) runs them.
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _probe(x, n):
    total = tl.load(x + tl.arange(0, 4)).sum()
    for i in range(tl.program_id(0), n):
        total += i
    tl.store(x, total)


def _problem():
    from flyarray.kernels._triton import runner
    try:
        runner(_probe, "cpu")[(1,)](torch.ones(4, dtype=torch.int32), 3)
    except Exception as exc:  # any failure means the interpreter cannot be trusted here
        return f"triton {triton.__version__}: {type(exc).__name__}: {str(exc)[:80]}"
    return None


INTERPRETER_PROBLEM = _problem()


def is_gpu_test(item) -> bool:
    """Tests that need a GPU say so in a skipif reason ('needs a GPU', 'needs a CUDA device', ...)."""
    for mark in item.iter_markers("skipif"):
        reason = str(mark.kwargs.get("reason", ""))
        if "GPU" in reason or "CUDA" in reason:
            return True
    return False
