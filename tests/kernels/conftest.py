"""Skip CPU-interpreter tests where Triton's interpreter itself cannot run (see tests/interpreter_probe.py)."""
import pytest

from tests.interpreter_probe import INTERPRETER_PROBLEM, is_gpu_test


def pytest_collection_modifyitems(config, items):
    if INTERPRETER_PROBLEM is None:
        return
    skip = pytest.mark.skip(reason=f"Triton's interpreter is unusable here ({INTERPRETER_PROBLEM}); "
                                   "CI runs these with Triton 3.9")
    for item in items:
        if not is_gpu_test(item) and "compile" not in item.name:
            item.add_marker(skip)
