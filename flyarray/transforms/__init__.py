"""Interpreters over the graph: jit (replay a traced program); grad and vmap come later."""
from .jit import jit  # noqa: F401
