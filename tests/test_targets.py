"""Every fused program of the corpus compiles for MI350 (gfx950) and Hopper (sm_90), without spills.

This runs on a CPU-only machine: Triton cross-compiles. fa.inspect is the
public face of it; this corpus is what CI proves on every change.
"""
import pytest
import torch

import flyarray as fa


def _x(shape, dtype=torch.float32):
    return fa.asarray(torch.randn(shape).to(dtype))


CORPUS = {
    "elementwise chain with broadcast": (lambda x, b: fa.exp(fa.abs(x * 2.0 - b)) / (1.0 + x * x), (_x((33, 70)), _x((70,)))),
    "silu(x)*z + 0.5x fp16": (lambda x, z: fa.silu(x) * z + 0.5 * x, (_x((64, 64), torch.float16), _x((64, 64), torch.float16))),
    "softmax bf16": (lambda x: fa.nn.softmax(x), (_x((16, 300), torch.bfloat16),)),
    "log_softmax": (lambda x: fa.nn.log_softmax(x), (_x((16, 300)),)),
    "rms_norm * w": (lambda x, w: fa.nn.rms_norm(x) * w, (_x((8, 96)), _x((96,)))),
    "layer_norm": (lambda x, w, b: fa.nn.layer_norm(x, w, b), (_x((8, 96)), _x((96,)), _x((96,)))),
    "sum(exp(x)*y, axis=1)": (lambda x, y: fa.sum(fa.exp(x) * y, axis=1), (_x((5, 40)), _x((5, 40)))),
    "argmax over axis 0": (lambda x: fa.argmax(x, axis=0), (_x((40, 7)),)),
    "var over (0, 2)": (lambda x: fa.var(x, axis=(0, 2)), (_x((6, 5, 4)),)),
    "long rows (looped)": (lambda x: fa.nn.softmax(x), (_x((2, 40000)),)),
    "integer ops": (lambda x: (x // 3 + x % 5) << 1, (fa.asarray(torch.randint(-50, 50, (30,))),)),
    "where / compare / cast": (lambda x: fa.where(x > 0, x, 0.0).astype(fa.float16), (_x((30, 30)),)),
    "transposed view": (lambda x: fa.sqrt(fa.abs(x.T))[::2], (_x((17, 9)),)),
    "concat": (lambda x, y: fa.concat([x, y * 2], axis=1), (_x((4, 5)), _x((4, 3)))),
    "complex64 chain (lowered to real)": (lambda z: fa.sqrt(fa.exp(z * z + 1j) / (z - 2.0)),
                                          (_x((33, 70), torch.complex64),)),
    "complex128 sum(a * conj(b))": (lambda a, b: fa.sum(a * fa.conj(b), axis=1),
                                    (_x((5, 40), torch.complex128), _x((5, 40), torch.complex128))),
    "arange/eye": (lambda x: x + fa.eye(6, device=x.device) * fa.arange(6, device=x.device).astype(fa.float32),
                   (_x((6, 6)),)),
}


@pytest.mark.parametrize("target", ["gfx950", "sm_90"])
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_corpus_compiles_without_spills(name, target):
    fn, args = CORPUS[name]
    result = fa.inspect(fn, *args, target=target)
    assert result.kernels, "the program should launch at least one kernel"
    for report in result.kernels:
        assert report.spills == 0, f"{name} spills on {target}: {report.summary()}"
        assert report.asm, "no assembly came back"


def test_inspect_reports_matrix_instructions_for_a_dot():
    """The ISA summary finds MFMA on gfx950 and wgmma on sm_90 (a plain Triton dot as the probe)."""
    import triton
    import triton.language as tl

    from flyarray.targets import KernelSpec, compile_for

    @triton.jit
    def dot(a, b, c, B: tl.constexpr):
        r = tl.arange(0, B)
        x = tl.load(a + r[:, None] * B + r[None, :])
        y = tl.load(b + r[:, None] * B + r[None, :])
        tl.store(c + r[:, None] * B + r[None, :], tl.dot(x, y))

    spec = KernelSpec("dot", dot, {"a": "*bf16", "b": "*bf16", "c": "*fp32", "B": "constexpr"}, {"B": 64})
    assert any(i.startswith("v_mfma") for i in compile_for(spec, "gfx950").matrix_instructions)
    assert any("gmma" in i.lower() for i in compile_for(spec, "sm_90").matrix_instructions)


def test_inspect_records_a_jitted_function_and_any_pytree_of_outputs():
    """fa.jit functions record inline (they ran on the host, and inspect saw no kernel); dict and nested
    outputs are flattened (they raised AttributeError)."""
    x = _x((8, 16))
    fa.reset_stats()
    assert len(fa.inspect(fa.jit(lambda a: fa.exp(a).sum(0)), x, target="sm_90").kernels) == 1
    assert len(fa.inspect(lambda a: {"y": (a * 2.0, [fa.exp(a).sum(0)])}, x, target="sm_90").kernels) == 2
    assert fa.stats()["kernels_launched"] == 0


def test_inspect_of_a_jitted_function_takes_torch_tensors_as_its_call_does():
    """Inlined under inspect's recording, fa.jit turns tensor arguments into arrays as a traced call does
    (the body ran torch math on the raw tensor: 0 kernels)."""
    f = fa.jit(lambda a, scale: a * scale, static_argnums=1)
    assert len(fa.inspect(f, torch.ones(3), 2.0, target="sm_90").kernels) == 1
    assert len(fa.inspect(fa.jit(lambda d: d["a"] + 1), {"a": torch.ones(3)}, target="sm_90").kernels) == 1


def test_inspect_refuses_an_evaluation_of_its_arguments():
    """The arguments stand for any values, as under fa.jit: a function that asks for a value of them is
    refused, not run on this machine and left out of the report (0 kernels, one evaluation run)."""
    from flyarray.plan import ConcretizationError
    x = _x((8,))
    fa.reset_stats()
    with pytest.raises(ConcretizationError, match="fa.inspect"):
        fa.inspect(lambda a: fa.eval(fa.exp(a) + 1), x, target="sm_90")
    with pytest.raises(ConcretizationError, match="fa.inspect"):
        fa.inspect(lambda a: a * float(fa.sum(fa.sin(a))), x, target="sm_90")
    assert fa.stats()["evaluations"] == 0
    assert len(fa.inspect(lambda a: a * 2.0, x, target="sm_90").kernels) == 1   # nothing left traced


def test_cross_compiling_in_the_interpreter_is_a_clear_error(monkeypatch):
    """With TRITON_INTERPRET=1 set at import, triton.jit builds interpreter functions: refused by name before
    anything records (it was an AttributeError about 'params' deep in the spec)."""
    from flyarray import targets
    from flyarray.targets import KernelSpec, compile_for
    monkeypatch.setattr(targets, "_probe", object())
    for call in (lambda: fa.inspect(lambda a: a + 1, _x((4,)), target="sm_90"),
                 lambda: compile_for(KernelSpec("k", None, {}, {}), "sm_90")):
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
            call()


def test_inspect_unknown_target_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown target"):
        fa.inspect(lambda x: x + 1, _x((4,)), target="gfx1100")


def test_inspect_shows_the_calls_kernels_readably():
    """A fused kernel and the library spec that matches the call (dtype, epilogue), as a table and as HTML
    with each kernel's source and assembly collapsed; fa.inspect launches nothing."""
    bf16 = torch.bfloat16
    a, b, bias = _x((64, 128), bf16), _x((128, 32), bf16), _x((32,), bf16)
    fa.reset_stats()
    result = fa.inspect(lambda a, b, c: (fa.silu(a @ b + c), fa.exp(c * 2.0)), a, b, bias, target="gfx950")
    assert fa.stats()["kernels_launched"] == 0
    assert sorted(result.kinds) == ["fused kernel", "matmul_epilogue (representative spec)"]
    gemm = result.kernels[result.kinds.index("matmul_epilogue (representative spec)")]
    assert "bf16" in gemm.name and "silu" in gemm.name and gemm.matrix_instructions[0].startswith("v_mfma")
    text = repr(result).splitlines()
    assert "VGPRs" in text[0] and len({line.index("|") for line in text[1:] if "|" in line}) == 1
    page = result._repr_html_()
    assert page.count("<details>") == 4 and "AMDGCN" in page and "Triton source" in page
    assert "def fa_" in page and "tl.load" in page and "v_mfma" in page


def test_amd_launch_options_only_for_amd_targets():
    """AMD compile options in a config reach AMD launches and compiles only: CUDA's Triton (3.6 on the
    H200) raises on an unknown launch keyword, the interpreter has no use for them."""
    from flyarray.targets import amd_launch_options
    cfg = {"BLOCK_M": 128, "num_warps": 8, "waves_per_eu": 2, "matrix_instr_nonkdim": 16}
    assert amd_launch_options(cfg, "gfx950") == {"waves_per_eu": 2, "matrix_instr_nonkdim": 16}
    assert amd_launch_options(cfg, "sm_90") == {} and amd_launch_options(cfg, "cpu") == {}


@pytest.mark.parametrize("fn", [lambda z: fa.tan(z), lambda z: fa.sum(fa.exp(z) * fa.sin(z), axis=-1)],
                         ids=["elementwise", "row"])
def test_float64_transcendental_kernels_keep_few_elements_a_thread_and_do_not_spill(fn):
    """libdevice's double-precision sin/exp/... take many registers: complex128 tan spilled 552 bytes on
    sm_90 at 8 elements a thread (benchmarks/xc_generated.py's sweep found seven such kernels)."""
    torch.manual_seed(0)
    z = fa.asarray(torch.complex(torch.rand(64, 64, dtype=torch.float64), torch.rand(64, 64, dtype=torch.float64)))
    (kernel,) = fa.inspect(fn, z, target="sm_90").kernels
    assert kernel.spills == 0, (kernel.spills, kernel.registers)


@pytest.mark.parametrize("target", ["gfx950", "gfx942", "sm_90"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64])
def test_round_and_complex_products_compile_for_every_target(target, dtype):
    """fa.round emitted libdevice's rint, which Triton 3.6's HIP libdevice lacks: round (and a complex prod, whose
    angles it rounds) did not compile for gfx950/gfx942 there; nearbyint (half to even too) exists everywhere."""
    x = _x((8, 40), dtype=dtype)
    fn = (lambda z: fa.prod(z, axis=-1)) if dtype.is_complex else (lambda z: fa.round(z * 3.0))
    result = fa.inspect(fn, x, target=target)
    assert result.kernels and all("rint(" not in k.triton_source.replace("nearbyint(", "") for k in result.kernels)


@pytest.mark.parametrize("target", ["sm_90", "gfx950"])
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_products_do_not_spill(target, dtype):
    """A complex prod's magnitude kernel holds a dozen float64 tiles: at 32 elements a thread it spilled 150 bytes
    (complex64) and 130 (complex128, the whole-array prod) on sm_90 under Triton 3.6; float64-rich kernels now
    take the heavy launch shape."""
    z = _x((64, 1000), dtype=dtype)
    for fn in (lambda z: fa.prod(z, axis=-1), lambda z: fa.prod(z)):
        for kernel in fa.inspect(fn, z, target=target).kernels:
            assert kernel.spills == 0, (kernel.name, kernel.spills, kernel.registers)


@pytest.mark.parametrize("dtype, expected, match", [
    (torch.bfloat16, {"gemm_bf16_square", "gemm_bf16_decode", "gemm_bf16_decode_splitk"}, "exact"),
    (torch.float16, None, "dtype")])
def test_inspect_of_a_plain_matmul_shows_no_epilogue_as_the_calls(dtype, expected, match):
    """A plain matmul listed the bias / silu / residual GEMMs as matching the call (a helper's round of the
    tooling); where no spec of its dtype is plain (float16 on gfx950), the closest is marked as not the call's."""
    from flyarray.inspection import matching_specs
    y = _x((64, 64), dtype) @ _x((64, 64), dtype)
    specs, how = matching_specs(y._node.inputs[0], "gfx950")
    assert how == match
    if expected is not None:
        assert {s.name for s in specs} == expected
