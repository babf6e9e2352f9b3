"""Does a Triton compile hold the GIL for long? (Whether precompile.py's thread pool can overlap compiles.)

A thread spins in Python while the main thread cross-compiles the first GEMM specs for sm_90 (no GPU
needed); every stretch longer than 20 ms in which the spinning thread could not run is a time the
compile held the GIL. Prints the compile's seconds and those stretches.

    PYTHONPATH=$PWD python benchmarks/compile_gil.py [n_specs]
"""
import os
import sys
import tempfile
import threading
import time

import triton
from triton.backends.compiler import GPUTarget

from flyarray import targets
from flyarray.kernels import gemm


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()  # a fresh cache: every spec compiles
    specs = list(gemm.compile_specs("sm_90"))[:n]
    stop, gaps = threading.Event(), []
    start = time.perf_counter()

    def spin():
        last = time.perf_counter()
        while not stop.is_set():
            now = time.perf_counter()
            if now - last > 0.02:
                gaps.append(now - last)
            last = now
    spinner = threading.Thread(target=spin)
    spinner.start()
    for spec in specs:
        src = targets._source_class(spec.fn)(spec.fn, signature=spec.signature, constexprs=spec.constexprs,
                                             attrs=targets._launch_attrs(spec))
        triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": spec.num_warps, "num_stages": spec.num_stages})
    stop.set()
    spinner.join()
    print(f"{len(specs)} specs compiled in {time.perf_counter() - start:.2f} s; the GIL held over 20 ms "
          f"{len(gaps)} times, {sum(gaps):.3f} s in all, longest {max(gaps, default=0):.3f} s")


if __name__ == "__main__":
    main()
