"""Every hand-written kernel's representative configs cross-compile for each target without spills,
within the target's shared memory / LDS.

The per-kernel tests check their own modules in more detail (matrix instructions, LDS); this one is
the net under all of them, for every target in flyarray.targets.TARGETS, gfx942 (MI300) included:
benchmarks/gfx950_summary.py prints the same as a table.
"""
import pytest

from flyarray.inspection import KERNEL_MODULES, module_specs
from flyarray.targets import TARGETS, compile_for


# Shared memory / LDS a workgroup may use: the compiler does not refuse more, the launch would.
SHARED_LIMIT = {"gfx950": 160 * 1024, "gfx942": 64 * 1024, "sm_90": 227 * 1024}


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("module", KERNEL_MODULES)
def test_every_config_compiles_without_spills(module, target):
    specs = module_specs(module, target)
    assert specs, f"{module} lists no specs for {target}"
    for spec in specs:
        report = compile_for(spec, target)
        assert report.spills == 0, report.summary()
        assert report.shared_bytes <= SHARED_LIMIT[target], report.summary()
