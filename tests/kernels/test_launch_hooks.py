"""While a Triton launch hook is set (a profiler such as proton), every direct launch (runtime.py's
generated kernels, kernels/_triton.py's DirectLaunch/FixedLaunch) steps aside for Triton's own path,
which calls the hook: one switch, read by both."""
import triton

from flyarray import runtime
from flyarray.kernels import _triton


def test_one_switch_sees_a_hook_come_and_go():
    knobs = triton.knobs.runtime
    before = knobs.launch_enter_hook
    assert runtime.launch_hooks_set is _triton.launch_hooks_set
    try:
        knobs.launch_enter_hook = None
        assert not _triton.launch_hooks_set()
        knobs.launch_enter_hook = lambda *args: None
        assert _triton.launch_hooks_set()
    finally:
        knobs.launch_enter_hook = before
    assert not _triton.launch_hooks_set()
