"""Does compiling for gfx942 depend on what the process compiled or ran before (the GPU host's pytest-xdist
workers failed test_cross_compile's ragged_dot/scaled_matmul gfx942 cases with a gfx950 instruction, which pass
alone)? Each scenario runs in a fresh process: the steps before, then every gfx942 spec of the module.

    PYTHONPATH=$PWD python benchmarks/probe_gfx942_order.py [module]
"""
import subprocess
import sys

BEFORE = {
    "nothing": "",
    "gfx950 specs": "[compile_for(s, 'gfx950') for s in module_specs(M, 'gfx950')]",
    "sm_90 specs": "[compile_for(s, 'sm_90') for s in module_specs(M, 'sm_90')]",
    "a GPU launch": "import torch; import flyarray as fa; x = torch.randn(64, 64, device='cuda', dtype=torch.bfloat16); "
                    "fa.matmul(fa.asarray(x), fa.asarray(x)).torch(); torch.cuda.synchronize()",
}
SCRIPT = """
import sys
from flyarray.inspection import module_specs
from flyarray.targets import compile_for
M = sys.argv[1]
{before}
bad = []
for s in module_specs(M, 'gfx942'):
    try:
        compile_for(s, 'gfx942')
    except Exception as e:
        bad.append((s.name, str(e).splitlines()[0][:80]))
print('FAILED' if bad else 'ok', bad[:3])
"""
module = sys.argv[1] if len(sys.argv) > 1 else "ragged_dot"
for name, before in BEFORE.items():
    r = subprocess.run([sys.executable, "-c", SCRIPT.format(before=before), module], capture_output=True, text=True,
                       timeout=240)
    tail = (r.stdout.strip().splitlines() or [""])[-1]
    err = "" if r.returncode == 0 else r.stderr.strip().splitlines()[-1][:200]
    print(f"{module:14} after {name:14} rc={r.returncode} {tail} {err}")
