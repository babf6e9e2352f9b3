"""MX on Hopper, the 'upcast' path and its parts (not part of the suite; prints, and writes JSON).

    PYTHONPATH=$PWD python benchmarks/tune_mx_upcast.py        # writes $OUT/tune_mx_upcast.json (OUT: /tmp)

1. mx_dequantize of 8192 x 8192 to bf16 (e4m3, e5m2, e2m1) for tile sizes and both fp8 decodes (the
   integer decode; the hardware conversion, ``dequant_native_fp8``), each checked bit for bit against the
   default config's output.
2. flyarray's bf16 GEMM at 8192^3 with the rhs K-major (what 'upcast' runs) and N-major, beside torch.
3. scaled_matmul(method='upcast') end to end, and a torch.profiler split of it per kernel.
4. The weight-only decode (16 x 14336 x 4096, MXFP4 and MXFP8) through the user's call, and a cProfile
   of 300 calls: the MXFP8 call measured 62-73 us against 39.5 us of device time (MXFP4: 32 / 32).

Timings: triton.testing.do_bench, median.
"""
import cProfile
import io
import json
import os
import pstats

import torch
import triton.testing

from flyarray.kernels import gemm, mx, scaled_matmul as sm
from flyarray.kernels._triton import current_arch, pick_config


def bench(fn) -> float:
    return float(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median"))


def dequant_rows(cfg, x) -> list:
    rows = []
    default = dict(cfg)
    for fmt in ("e4m3", "e5m2", "e2m1"):
        data, scales = mx.mx_quantize(x, fmt)
        want = mx.mx_dequantize(data, scales, fmt, dtype=torch.bfloat16).view(torch.int16)
        for blocks, warps in [(64, 4), (128, 8), (256, 8)]:
            for native in ([False, True] if fmt != "e2m1" else [False]):
                cfg.update(dequant_blocks=blocks, dequant_warps=warps, dequant_native_fp8=native)
                got = mx.mx_dequantize(data, scales, fmt, dtype=torch.bfloat16).view(torch.int16)
                fn = lambda: mx.mx_dequantize(data, scales, fmt, dtype=torch.bfloat16)  # noqa: E731
                rows.append(dict(case="dequantize", fmt=fmt, blocks=blocks, warps=warps, native=native,
                                 exact=bool(torch.equal(got, want)), ms=bench(fn)))
                print(json.dumps(rows[-1]), flush=True)
        cfg.clear()
        cfg.update(default)
    return rows


def upcast_rows(x, w) -> list:
    a, sa = mx.mx_quantize(x, "e4m3")
    b, sb = mx.mx_quantize(w, "e4m3")
    a16 = mx.mx_dequantize(a, sa, "e4m3", dtype=torch.bfloat16)
    b16 = mx.mx_dequantize(b, sb, "e4m3", dtype=torch.bfloat16)
    b_kn = b16.t().contiguous()
    timed = {"gemm rhs K-major (upcast's)": lambda: gemm.matmul(a16, b16.t()),
             "gemm rhs N-major": lambda: gemm.matmul(a16, b_kn),
             "torch rhs K-major": lambda: a16 @ b16.t(), "torch rhs N-major": lambda: a16 @ b_kn,
             "scaled_matmul upcast": lambda: sm.scaled_matmul(a, b, sa, sb, method="upcast"),
             "scaled_matmul fp8_blocks": lambda: sm.scaled_matmul(a, b, sa, sb, method="fp8_blocks")}
    rows = [dict(case=name, ms=bench(fn)) for name, fn in timed.items()]
    for r in rows:
        print(json.dumps(r), flush=True)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            sm.scaled_matmul(a, b, sa, sb, method="upcast")
        torch.cuda.synchronize()
    per_kernel = {e.key: e.device_time_total / e.count for e in prof.key_averages() if e.device_time_total > 0}
    rows.append(dict(case="upcast per kernel (us)", kernels=per_kernel))
    print(json.dumps(rows[-1]), flush=True)
    return rows


def decode_rows() -> list:
    rows = []
    xs = torch.randn(16, 4096, device="cuda").bfloat16()
    for fmt in ("e2m1", "e4m3"):
        w, sw = mx.mx_quantize(torch.randn(14336, 4096, device="cuda"), fmt)
        fn = lambda: sm.scaled_matmul(xs, w, None, sw, preferred_element_type=torch.bfloat16)  # noqa: E731
        fn()
        torch.cuda.synchronize()
        rows.append(dict(case="weight-only decode user path", fmt=fmt, us=bench(fn) * 1000))
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(300):
            fn()
        torch.cuda.synchronize()
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(12)
        rows[-1]["cprofile"] = text.getvalue()[:4000]
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "cprofile"}), flush=True)
        print(rows[-1]["cprofile"], flush=True)
    return rows


def main():
    cfg = pick_config(mx.CONFIGS, current_arch(torch.device("cuda")))
    x = torch.randn(8192, 8192, device="cuda")
    w = torch.randn(8192, 8192, device="cuda")
    rows = dequant_rows(cfg, x) + upcast_rows(x, w) + decode_rows()
    path = os.path.join(os.environ.get("OUT", "/tmp"), "tune_mx_upcast.json")
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
