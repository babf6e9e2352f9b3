"""Does the seed block's forward under backend="flyarray" get slower with what ran before it in the process?

`bench --suite torch` timed it at 1.047x eager after the Llama block's case, while
benchmarks/host_seed_block.py (a fresh process) gave 1.075-1.097x in the same call (twenty-third session).
This times ours and eager (do_bench, as the bench does) and our host time per call, fresh, then after
torch.compile of the same block, after the Llama block's case (ours, Inductor, eager), after 5 s idle and
after torch.cuda.empty_cache(); each stage notes the threads alive, whether a Triton launch hook is set, and
the device time of each kernel (torch.profiler).

    PYTHONPATH=$PWD python benchmarks/seed_block_state.py
"""
import threading
import time

import torch
from gpu_timing import profiled_us as kernel_us  # device us per call by kernel name
from host_seed_block import _host_us as host_us  # one call's host time, the GPU idle before it

from flyarray.bench import torch_models
from flyarray.bench.harness import time_ms
from flyarray.kernels._triton import launch_hooks_set


def stage(tag, case):
    for _ in range(3):
        case.ours(), case.eager()
    ours = [time_ms(case.ours, torch.device("cuda")) * 1e3 for _ in range(2)]
    eager = [time_ms(case.eager, torch.device("cuda")) * 1e3 for _ in range(2)]
    print(f"{tag:28s} ours {min(ours):7.1f} us  eager {min(eager):7.1f} us  eager/ours {min(eager) / min(ours):.3f}  "
          f"host ours {host_us(case.ours):6.1f} eager {host_us(case.eager):6.1f} us  threads {threading.active_count()}"
          f"  hook {launch_hooks_set()}", flush=True)
    try:
        ours_k, eager_k = kernel_us(case.ours), kernel_us(case.eager)
    except Exception as e:  # noqa: BLE001  (a profiler failure must not lose the timings)
        print(f"    kernels: profiler failed: {e!r}"[:300], flush=True)
        return
    print(f"    kernels ours {sum(ours_k.values()):.1f} us {ours_k}", flush=True)
    print(f"    kernels eager {sum(eager_k.values()):.1f} us {eager_k}", flush=True)


def main():
    cases = torch_models.cases("cuda", small=False)
    llama, fwd = cases[0], cases[1]
    assert fwd.name.startswith("block fwd "), fwd.name
    fwd.ours(), fwd.eager()
    stage("fresh", fwd)
    compiled = torch.compile(fwd.compilable)
    compiled()
    stage("after inductor (this block)", fwd)
    llama.ours(), llama.eager()
    torch.compile(llama.compilable)()
    for _ in range(3):
        llama.ours(), llama.eager()
    stage("after the llama case", fwd)
    time.sleep(5)
    stage("after 5 s idle", fwd)
    torch.cuda.empty_cache()
    stage("after empty_cache", fwd)


if __name__ == "__main__":
    main()
