"""The attention decode path's K split against the waves of programs an SM holds (issue 15: "a decode path
(split-K) at the K+V bandwidth limit"; the bench row B8 32q/8kv Sk8192 D128 reads 85.8 us against a 62.8 us
limit and SDPA's 80.5 on the H200).

The default split aims at ``decode_programs_per_sm`` (4 on sm_90) programs per SM, but a program's pipelined K
and V tiles leave room for fewer (cross-compiled for sm_90 at hd128 bf16: 70 KiB of shared memory, so 3 an
H200 SM): the bench row's 576 programs run in 1.45 waves of 396. This times every split from 1 to 32 beside
the default and SDPA, each checked against fp32 math first, and prints the compiled split kernel's registers
and shared memory with the programs per SM they allow.

    PYTHONPATH=$PWD python3 benchmarks/tune_attention_decode.py [OUT.json]
"""
import json
import sys

import torch
import torch.nn.functional as F

from flyarray.bench.harness import time_graph_ms
from flyarray.kernels import attention as A

SHAPES = [  # (B, Hq, Hkv, Sq, Sk, D)
    (8, 32, 8, 1, 8192, 128),     # the bench row
    (1, 32, 8, 1, 32768, 128),    # one long sequence
    (16, 32, 32, 1, 4096, 128),   # multi-head
    (8, 32, 8, 4, 8192, 128),     # four queries a step (speculative decoding)
]
SPLITS = [None, 1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 24, 32]


def _compiled_facts(kernel, device):
    """(registers, shared bytes) of the compiled kernels Triton keeps for ``device``; [] if not reachable."""
    facts = []
    caches = getattr(kernel, "device_caches", {})
    for cache in caches.values():
        for compiled in (cache[0] if isinstance(cache, tuple) else cache).values():
            facts.append((getattr(compiled, "n_regs", None), getattr(compiled.metadata, "shared", None)))
    return facts


def main(out_path=None):
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    rows = []
    for B, Hq, Hkv, Sq, Sk, D in SHAPES:
        torch.manual_seed(0)
        q = torch.randn(B, Sq, Hq, D, device=dev, dtype=torch.bfloat16)
        k = torch.randn(B, Sk, Hkv, D, device=dev, dtype=torch.bfloat16)
        v = torch.randn(B, Sk, Hkv, D, device=dev, dtype=torch.bfloat16)
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        ref = F.scaled_dot_product_attention(qt.float(), kt.float(), vt.float(), enable_gqa=Hq != Hkv).transpose(1, 2)
        limit_us = 2 * k.numel() * k.element_size() / 4.8e12 * 1e6   # H200 HBM3e peak; the copy rate is ~4.15 TB/s
        sdpa_us = time_graph_ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=Hq != Hkv), dev) * 1e3
        for splits in SPLITS:
            out, _ = A.attention_decode(q, k, v, num_splits=splits)
            err = ((out.float() - ref).norm() / ref.norm()).item()
            us = time_graph_ms(lambda: A.attention_decode(q, k, v, num_splits=splits), dev) * 1e3
            row = dict(shape=f"B{B} {Hq}q/{Hkv}kv Sq{Sq} Sk{Sk} D{D}", splits=splits, us=round(us, 2),
                       sdpa_us=round(sdpa_us, 2), vs_sdpa=round(sdpa_us / us, 3), rel_err=err,
                       bytes_limit_us=round(limit_us, 1))
            rows.append(row)
            print(json.dumps(row), flush=True)
            assert err < 2e-2, row
    facts = _compiled_facts(A._attn_decode_split_kernel, dev)
    per_sm = [dict(registers=r, shared=s, by_shared=props.shared_memory_per_multiprocessor // max(s, 1),
                   by_registers=65536 // max(r * 128, 1)) for r, s in facts if r and s is not None]
    print("split kernel (registers, shared bytes, programs an SM holds by each):", per_sm)
    print("SMs:", props.multi_processor_count, "decode_programs_per_sm:", A._SM90["decode_programs_per_sm"])
    if out_path:
        json.dump(dict(rows=rows, compiled=per_sm, sms=props.multi_processor_count), open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
