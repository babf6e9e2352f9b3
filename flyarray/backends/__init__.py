"""Backends run a scheduled Kernel: gpu (compiled Triton), interpret (Triton's interpreter), reference (torch)."""
