"""Instructions in the sm_90 MX decode kernel's main loop, cross-compiled (no GPU): a proxy for the
decode-bound kernel's speed, used to choose which decode variants to time (benchmarks/tune_mx_decode.py).

    PYTHONPATH=$PWD python benchmarks/count_mx_decode.py [e2m1,e4m3]

For each config below it compiles the decode kernel as it launches at 16x14336x4096 (every int argument
divisible by 16, as Triton specializes it there: x then goes through 16-byte cp.async) and prints, for the
loop of the largest backward branch in the SASS, its instructions, those per decoded element
(x threads / (BLOCK_N x BLOCK_K x K steps an iteration: 2 with PAIR_STEPS)), the scale loads (LDG: the
pipeliner leaves them synchronous): for how many K steps they are all issued before the loop's first
decode (PAIR_STEPS: 2, so the second step does not wait for its scales), the integer-pipe ones (PRMT,
LOP3, SHF, ... : half the issue rate of the FMA pipe, where IMAD and HMUL2 go), registers, spills,
shared memory, and the ttg.convert_layout / ttg.local_alloc ops in the TTGIR.
"""
import collections
import dataclasses
import re
import sys

import triton
from triton.compiler import ASTSource

from flyarray import targets
from flyarray.kernels import scaled_matmul as sm

INT_PIPE = {"PRMT", "LOP3", "SHF", "SEL", "ISETP", "IADD3", "LEA", "PLOP3", "MOV", "VIADD"}
TILES = [dict(BLOCK_N=32, BLOCK_K=256, num_warps=2), dict(BLOCK_N=64, BLOCK_K=256, num_warps=4),
         dict(BLOCK_N=128, BLOCK_K=128, num_warps=8)]
VARIANTS = [{}, dict(QUAD_SIGNS=True, ALIGNED_K=True), dict(SPLIT_WORDS=2, QUAD_SIGNS=True, ALIGNED_K=True),
            dict(SPLIT_WORDS=4, QUAD_SIGNS=True, ALIGNED_K=True), dict(SPLIT_WORDS=8, ALIGNED_K=True),
            dict(PAIR_STEPS=True), dict(PAIR_STEPS=True, num_stages=2),
            dict(SPLIT_WORDS=4, QUAD_SIGNS=True, ALIGNED_K=True, PAIR_STEPS=True)]


def loop_ops(sass: str) -> list:
    """The opcodes between the target and the source of the SASS's longest backward branch."""
    lines = [ln for ln in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", ln)]
    at = {int(re.match(r"\s+/\*([0-9a-f]+)\*/", ln).group(1), 16): i for i, ln in enumerate(lines)}
    best = (0, -1)
    for i, ln in enumerate(lines):
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", ln)
        if m and at.get(int(m.group(1), 16), i) < i and i - at[int(m.group(1), 16)] > best[1] - best[0]:
            best = (at[int(m.group(1), 16)], i)
    body = [re.sub(r"^\s+/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?", "", ln) for ln in lines[best[0]:best[1] + 1]]
    return [ins.split()[0].rstrip(";") for ins in body]


def _is_ldg(op: str) -> bool:
    return op == "LDG" or op.startswith("LDG.")


def count(cfg: dict, w_fmt: str) -> dict:
    spec = sm._decode_spec("sm_90", w_fmt, dict(dict(kernel="decode", SPLIT_K=1, num_stages=3), **cfg))
    spec = dataclasses.replace(spec, divisible=tuple(k for k, t in spec.signature.items() if t == "i32"))
    src = ASTSource(spec.fn, signature=spec.signature, constexprs=spec.constexprs, attrs=targets._launch_attrs(spec))
    with targets.triton_cache_scope():
        compiled = triton.compile(src, target=targets.TARGETS["sm_90"],
                                  options={"num_warps": spec.num_warps, "num_stages": spec.num_stages})
    sass = targets._cuobjdump(compiled.asm["cubin"], "--dump-sass")
    usage = targets._cuobjdump(compiled.asm["cubin"], "--dump-resource-usage")
    ops = loop_ops(sass)
    steps = 2 if cfg.get("PAIR_STEPS") else 1   # K steps a loop iteration
    per_elem = 32 * spec.num_warps / (cfg["BLOCK_N"] * cfg["BLOCK_K"] * steps)
    ttgir = compiled.asm["ttgir"]
    first_decode = next(i for i, o in enumerate(ops) if o.startswith("HMUL2"))
    return dict(loop=len(ops), per_elem=len(ops) * per_elem,
                scale_steps=steps * sum(_is_ldg(o) for o in ops[:first_decode]) / max(1, sum(_is_ldg(o) for o in ops)),
                int_per_elem=sum(o.split(".")[0] in INT_PIPE for o in ops) * per_elem,
                regs=targets._last_int(r"REG:(\d+)", usage),
                spills=targets._nvidia_spills(compiled.asm["ptx"], usage, sass), smem=compiled.metadata.shared,
                convert_layout=ttgir.count("ttg.convert_layout"), local_alloc=ttgir.count("ttg.local_alloc"),
                top=collections.Counter(o.split(".")[0] for o in ops).most_common(6))


def main():
    formats = sys.argv[1].split(",") if len(sys.argv) > 1 else ["e2m1"]
    print(f"Triton {triton.__version__}")
    print("| fmt | N/K/warps | variant | loop SASS (an iteration) | /elem | scale steps loaded | int-pipe /elem | regs | spills | smem | cvt/alloc | top |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for w_fmt in formats:
        for tile in TILES:
            for v in VARIANTS:
                r = count(dict(tile, **v), w_fmt)
                name = " ".join(f"{k}={val}" for k, val in v.items()) or "plain"
                print(f"| {w_fmt} | {tile['BLOCK_N']}/{tile['BLOCK_K']}/{tile['num_warps']} | {name} | {r['loop']} | "
                      f"{r['per_elem']:.2f} | {r['scale_steps']:g} | {r['int_per_elem']:.2f} | {r['regs']} | {r['spills']} | {r['smem']} | "
                      f"{r['convert_layout']}/{r['local_alloc']} | {r['top']} |", flush=True)


if __name__ == "__main__":
    main()
