"""Host-path patterns from the fourteenth session's hunt, per call (us), best of 5 repeats; torch 1 thread.

    FLYARRAY_CACHE_DIR=$(mktemp -d) PYTHONPATH=$PWD python benchmarks/host_patterns.py out.json
"""
import collections
import json
import sys
import time
import timeit

import numpy as np
import torch

torch.set_num_threads(1)

import flyarray as fa


def best(fn, n):
    fn()
    return min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6

out = {}
t = torch.randn(64, 64)
out["simple (asarray(t)+1).torch()"] = best(lambda: (fa.asarray(t) + 1).torch(), 500)
seq = torch.randn(2000, 64); S = fa.asarray(seq) * 1.0; fa.eval(S)
it = iter(range(10**9))
out["row loop (S[i]*2+1).torch(), S evaluated"] = best(lambda: (S[next(it) % 2000] * 2 + 1).torch(), 300)
k = fa.random.key(0); fa.eval(k)
out["random.split(k) recording"] = best(lambda: fa.random.split(k), 300)
f = fa.jit(lambda a, lr: a * lr)
lrs = iter(range(10**9))
x = fa.ones(3)
out["jit(a*lr)(x, np.float32(new lr))"] = best(lambda: f(x, np.float32(0.001 * next(lrs))), 200)
P = collections.namedtuple("P", "w b")
def loss(ps, x, y):
    h = x
    for p in ps:
        h = fa.tanh(h @ p.w + p.b)
    return fa.mean((h - y) ** 2)
torch.manual_seed(0)
params = [P(fa.asarray(torch.randn(16, 16) * 0.1), fa.asarray(torch.zeros(16))) for _ in range(3)]
X, Y = torch.randn(8, 16), torch.randn(8, 16)
vg = fa.value_and_grad(loss)
st = {"p": params}
def step():
    l, g = vg(st["p"], fa.asarray(X), fa.asarray(Y))
    st["p"] = fa.tree_util.tree_map(lambda p, g: p - 0.01 * g, st["p"], g)
    float(l)
times = []
for i in range(30):
    t0 = time.perf_counter(); step(); times.append((time.perf_counter() - t0) * 1e6)
out["lazy MLP step reading only the loss, step 30"] = times[-1]
out["lazy MLP step, median of steps 20-30"] = sorted(times[20:])[5]
with open(sys.argv[1], "w") as f_out:
    json.dump(out, f_out, indent=1)
for k_, v in out.items():
    print(f"{v:10.1f}  {k_}")
