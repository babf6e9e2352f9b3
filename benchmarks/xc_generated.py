"""A pytest plugin: cross-compile every fused kernel the tests schedule, for Triton targets, at the end.

The interpreter (CI's CPU backend) runs generated kernels, but it accepts code the real compilers may not,
and it says nothing about registers or spills. This plugin records each KernelStep the scheduler makes
(the kernel exactly as a launch would specialize it: inspection.fused_spec) and, when the session ends,
compiles each distinct one for every target in XC_TARGETS (default sm_90,gfx950), writing compile failures
and spills as JSON to XC_OUT (default ./xc_generated.json; a worker's id is appended under xdist).

    FLYARRAY_BACKEND=interpret XC_OUT=/tmp/xc.json PYTHONPATH=$PWD:$PWD/benchmarks \\
        python -m pytest -p xc_generated -n 0 -q tests/test_elementwise.py tests/test_complex.py

Slow: each distinct kernel is a full compile per target (2567 kernels from 11 test files took about 45
minutes on 2 cores).
"""
import json
import os
import traceback

import flyarray.plan as _plan
from flyarray.schedule import KernelStep

_specs = {}
_unbuildable = []
_schedule = _plan.schedule


def _recording_schedule(roots):
    steps = _schedule(roots)
    from flyarray.inspection import fused_spec
    for step in steps:
        if isinstance(step, KernelStep):
            try:
                spec = fused_spec(step)
            except Exception as exc:  # a kernel the launch path itself could not specialize
                _unbuildable.append(repr(exc)[:300])
                continue
            key = (spec.name, tuple(sorted(spec.signature.items())), tuple(sorted(map(str, spec.constexprs.items()))),
                   spec.divisible)
            _specs.setdefault(key, spec)
    return steps


_plan.schedule = _recording_schedule


def pytest_sessionfinish(session, exitstatus):
    from flyarray.targets import compile_for
    targets = os.environ.get("XC_TARGETS", "sm_90,gfx950").split(",")
    out = {"distinct_kernels": len(_specs), "unbuildable": _unbuildable, "failures": [], "spills": []}
    for spec in _specs.values():
        for target in targets:
            try:
                report = compile_for(spec, target)
            except Exception as exc:
                out["failures"].append({"name": spec.name, "target": target, "signature": dict(spec.signature),
                                        "error": "".join(traceback.format_exception_only(exc))[-800:],
                                        "source": getattr(spec.fn, "src", "")})
                continue
            if report.spills:
                out["spills"].append({"name": spec.name, "target": target, "spills": report.spills,
                                      "registers": report.registers, "num_warps": spec.num_warps,
                                      "signature": dict(spec.signature), "source": getattr(spec.fn, "src", "")})
    path = os.environ.get("XC_OUT", "xc_generated.json") + os.environ.get("PYTEST_XDIST_WORKER", "")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
