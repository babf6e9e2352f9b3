"""Skip CPU-interpreter tests where Triton's interpreter itself cannot run (see tests/interpreter_probe.py)."""
from pathlib import Path

import pytest

from tests.interpreter_probe import INTERPRETER_PROBLEM, is_gpu_test


_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    if INTERPRETER_PROBLEM is None:
        return
    skip = pytest.mark.skip(reason=f"Triton's interpreter is unusable here ({INTERPRETER_PROBLEM}); "
                                   "CI runs these with Triton 3.9")
    # pytest calls this hook with every collected item, not only this directory's: without the path test, a
    # whole-suite run on the GPU host skipped the core suite's CPU tests too
    for item in items:
        if _HERE in Path(item.path).resolve().parents and not is_gpu_test(item) and "compile" not in item.name:
            item.add_marker(skip)
