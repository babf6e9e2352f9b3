"""Interpreters over the graph: jit (replay a traced program), autodiff (grad, vjp, jvp); vmap is fa.vmap (transforms/batching.py)."""
from .jit import jit  # noqa: F401
from .autodiff import custom_jvp, custom_vjp, grad, jvp, stop_gradient, value_and_grad, vjp  # noqa: F401,E402
