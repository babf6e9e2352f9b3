"""A warp-specialized GEMM for Hopper (sm_90) in Gluon: ``activation(a @ b + bias) + residual``.

``gemm._gemm_kernel`` (Triton) keeps one instruction stream per warpgroup: its TMA loads, its wgmma
waits and its epilogue take turns, and Triton 3.6 has no warp specialization on sm_90. On the widest
GEMMs of a Llama block it runs at 0.89-0.96x cuBLAS on an H100 (docs/benchmarks.md). This kernel is
cuBLAS's and CUTLASS's "cooperative" structure:

- a one-warp **producer** partition issues every TMA load: per k step one [BLOCK_K] slab of a's
  BLOCK_M rows (two 64-row boxes) and of b's BLOCK_N columns into a STAGES-deep ring of shared
  buffers, each slot under a "ready" mbarrier; it waits on the slot's "empty" mbarrier before
  refilling it, so it runs ahead into the next tile while the consumers run their epilogue;
- two **consumer** partitions (one warpgroup each: the default partition and a worker) each own 64
  rows of the [BLOCK_M, BLOCK_N] tile: per k step they wait for "ready", issue an asynchronous
  wgmma, wait for the one before it and hand its slot back through "empty" (one arrival each);
- the epilogue runs in registers (bias, activation in fp32; a residual tile is loaded by TMA into
  the staging buffer before the k loop, so its latency hides behind the MMAs) and leaves by a TMA
  store, which clips rows and columns past M and N.

Persistent: one program per SM walks tiles ``pid, pid + NUM_PROGRAMS, ...`` in GROUP_M super-groups
(as ``gemm._tile_coords``). Operands: 16-bit (fp16/bf16), 2-D, each either K-contiguous or
M/N-contiguous (``A_KMAJOR``/``B_KMAJOR``), 16-byte aligned rows (TMA); the host checks. Gluon runs
only on an sm_90 GPU (the interpreter does not run it); ``compile_specs`` cross-compiles it anywhere.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .attention_hopper import _mma_layout, _smem_layout, _tma_load, _tma_store
from .gemm import _activate, _tile_coords  # @triton.jit helpers without layouts: Gluon calls them as its own


# A worker partition receives its arguments as run-time values (constexpr ones too), so the partitions
# read what must be known at compile time from the types of the shared buffers: the sizes from their
# shapes, b's orientation from whether b_smem's rows are BLOCK_N long (B_KMAJOR: [STAGES, BLOCK_N,
# BLOCK_K]; BLOCK_N != BLOCK_K), and the other flags from the shape of ``flags``, a buffer of at most 128
# bytes that holds nothing: [1 + A_KMAJOR, 1 << ACTIVATION, 1 + HAS_BIAS, 1 + HAS_RESIDUAL].
@gluon.jit
def _producer(a_desc, b_desc, a_smem, b_smem, c_smem, flags, ready, empty, M, N, K, group_m, num_programs):
    HALF: gl.constexpr = 64
    A_KMAJOR: gl.constexpr = flags.shape[0] == 2
    BLOCK_N: gl.constexpr = c_smem.shape[2]
    STAGES: gl.constexpr = b_smem.shape[0]
    BLOCK_K: gl.constexpr = b_smem.shape[1] * b_smem.shape[2] // BLOCK_N
    B_KMAJOR: gl.constexpr = b_smem.shape[1] == BLOCK_N
    num_pid_m = gl.cdiv(M, 2 * HALF)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    k_steps = gl.cdiv(K, BLOCK_K)
    nbytes: gl.constexpr = 2 * a_desc.block_type.nbytes + b_desc.block_type.nbytes
    it = 0
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, num_programs):
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, group_m)
        m0 = pid_m * 2 * HALF
        n0 = pid_n * BLOCK_N
        for ks in range(k_steps):
            slot = it % STAGES
            # both consumers must be done with the slot's last step; a fresh barrier passes parity 1
            mbarrier.wait(empty.index(slot), ((it // STAGES) & 1) ^ 1)
            bar = ready.index(slot)
            mbarrier.expect(bar, nbytes)
            k0 = ks * BLOCK_K
            for h in gl.static_range(2):
                if A_KMAJOR:
                    _tma_load(a_desc, [m0 + h * HALF, k0], bar, a_smem.index(2 * slot + h))
                else:
                    _tma_load(a_desc, [k0, m0 + h * HALF], bar, a_smem.index(2 * slot + h))
            if B_KMAJOR:
                _tma_load(b_desc, [n0, k0], bar, b_smem.index(slot))
            else:
                _tma_load(b_desc, [k0, n0], bar, b_smem.index(slot))
            it += 1


@gluon.jit
def _store_gelu_by_halves(acc, stage, BLOCK_N: gl.constexpr):
    """Exact GELU (erf) on the accumulator's two column halves one after the other, each stored as it is
    done: erf's temporaries for all 128 values a thread holds spilled registers (265 bytes, Triton 3.6).
    Columns c and c + BLOCK_N/2 lie in the same thread (the wgmma layout repeats every 8 columns), so the
    split moves no data."""
    lo, hi = gl.split(gl.permute(gl.reshape(acc, [acc.shape[0], 2, BLOCK_N // 2]), (0, 2, 1)))
    stage.slice(0, BLOCK_N // 2, 1).store(_activate(lo, 2).to(stage.dtype))
    stage.slice(BLOCK_N // 2, BLOCK_N // 2, 1).store(_activate(hi, 2).to(stage.dtype))


@gluon.jit
def _consumer(c_desc, r_desc, Bias, a_smem, b_smem, c_smem, flags, r_bar, ready, empty, M, N, K, half_index,
              group_m, num_programs):
    """Rows [64 * half_index, 64 * half_index + 64) of every tile of this program."""
    HALF: gl.constexpr = c_smem.shape[1]
    A_KMAJOR: gl.constexpr = flags.shape[0] == 2
    ACTIVATION: gl.constexpr = flags.shape[1].bit_length() - 1
    HAS_BIAS: gl.constexpr = flags.shape[2] == 2
    HAS_RESIDUAL: gl.constexpr = flags.shape[3] == 2
    BLOCK_N: gl.constexpr = c_smem.shape[2]
    STAGES: gl.constexpr = b_smem.shape[0]
    BLOCK_K: gl.constexpr = b_smem.shape[1] * b_smem.shape[2] // BLOCK_N
    B_KMAJOR: gl.constexpr = b_smem.shape[1] == BLOCK_N
    acc_layout: gl.constexpr = _mma_layout(4, BLOCK_N)
    out_dtype: gl.constexpr = c_smem.dtype
    num_pid_m = gl.cdiv(M, 2 * HALF)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    k_steps = gl.cdiv(K, BLOCK_K)
    stage = c_smem.index(half_index)
    it = 0
    done = 0
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, num_programs):
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, group_m)
        row0 = pid_m * 2 * HALF + half_index * HALF
        n0 = pid_n * BLOCK_N
        if HAS_RESIDUAL:     # prefetch: the residual tile lands in the staging buffer during the k loop
            tma.store_wait(0)    # once the last tile's store has read that buffer
            mbarrier.expect(r_bar.index(half_index), r_desc.block_type.nbytes)
            _tma_load(r_desc, [row0, n0], r_bar.index(half_index), stage)
        acc = gl.zeros([HALF, BLOCK_N], gl.float32, acc_layout)
        for ks in range(k_steps):
            slot = it % STAGES
            mbarrier.wait(ready.index(slot), (it // STAGES) & 1)
            a = a_smem.index(2 * slot + half_index)
            if not A_KMAJOR:
                a = a.permute((1, 0))
            b = b_smem.index(slot)
            if B_KMAJOR:
                b = b.permute((1, 0))
            acc = warpgroup_mma(a, b, acc, is_async=True)
            acc = warpgroup_mma_wait(1, deps=(acc,))     # the step before is done: its slot is free
            mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), pred=ks >= 1)
            it += 1
        acc = warpgroup_mma_wait(0, deps=(acc,))
        mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES))

        if not HAS_RESIDUAL:
            tma.store_wait(0)    # the last tile's store has read the staging buffer
        if HAS_BIAS:
            cols = n0 + gl.arange(0, BLOCK_N, gl.SliceLayout(0, acc_layout))
            bias = gl.load(Bias + cols, mask=cols < N, other=0.0)
            acc = acc + bias.to(gl.float32)[None, :]
        if ACTIVATION == 2 and not HAS_RESIDUAL:
            _store_gelu_by_halves(acc, stage, BLOCK_N)
        else:
            acc = _activate(acc, ACTIVATION)
            if HAS_RESIDUAL:
                mbarrier.wait(r_bar.index(half_index), done & 1)
                acc = acc + stage.load(acc_layout).to(gl.float32)
            stage.store(acc.to(out_dtype))
        fence_async_shared()
        _tma_store(c_desc, [row0, n0], stage)
        done += 1
    tma.store_wait(0)


@gluon.jit
def _gemm_ws_kernel(A, B, C, Bias, Res, M, N, K, s_a, s_b, s_c, s_r,
                    A_KMAJOR: gl.constexpr, B_KMAJOR: gl.constexpr, HAS_BIAS: gl.constexpr,
                    ACTIVATION: gl.constexpr, HAS_RESIDUAL: gl.constexpr,
                    BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr,
                    STAGES: gl.constexpr, NUM_PROGRAMS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                    PRODUCER_REGS: gl.constexpr, num_warps: gl.constexpr):
    """Launched with num_warps=4 (the first consumer) on min(tiles, NUM_PROGRAMS) programs. s_a is
    a's row stride (A_KMAJOR: [M, K] rows; else its [K, M] transpose's), s_b likewise for b ([N, K]
    rows when B_KMAJOR, else [K, N]); s_c, s_r: the result's and residual's row strides."""
    gl.static_assert(num_warps == 4, "the default partition is one consumer warpgroup")
    gl.static_assert(BLOCK_N != BLOCK_K, "")
    HALF: gl.constexpr = 64
    dtype: gl.constexpr = A.dtype.element_ty
    if A_KMAJOR:
        a_desc = tma.make_tensor_descriptor(A, shape=[M, K], strides=[s_a, 1], block_shape=[HALF, BLOCK_K],
                                            layout=_smem_layout(HALF, BLOCK_K, dtype))
        a_smem = gl.allocate_shared_memory(dtype, [2 * STAGES, HALF, BLOCK_K], a_desc.layout)
    else:
        a_desc = tma.make_tensor_descriptor(A, shape=[K, M], strides=[s_a, 1], block_shape=[BLOCK_K, HALF],
                                            layout=_smem_layout(BLOCK_K, HALF, dtype))
        a_smem = gl.allocate_shared_memory(dtype, [2 * STAGES, BLOCK_K, HALF], a_desc.layout)
    if B_KMAJOR:
        b_desc = tma.make_tensor_descriptor(B, shape=[N, K], strides=[s_b, 1], block_shape=[BLOCK_N, BLOCK_K],
                                            layout=_smem_layout(BLOCK_N, BLOCK_K, dtype))
        b_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
    else:
        b_desc = tma.make_tensor_descriptor(B, shape=[K, N], strides=[s_b, 1], block_shape=[BLOCK_K, BLOCK_N],
                                            layout=_smem_layout(BLOCK_K, BLOCK_N, dtype))
        b_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_K, BLOCK_N], b_desc.layout)
    c_layout: gl.constexpr = _smem_layout(HALF, BLOCK_N, C.dtype.element_ty)
    c_desc = tma.make_tensor_descriptor(C, shape=[M, N], strides=[s_c, 1], block_shape=[HALF, BLOCK_N],
                                        layout=c_layout)
    r_desc = c_desc
    if HAS_RESIDUAL:
        r_desc = tma.make_tensor_descriptor(Res, shape=[M, N], strides=[s_r, 1], block_shape=[HALF, BLOCK_N],
                                            layout=c_layout)
    c_smem = gl.allocate_shared_memory(C.dtype.element_ty, [2, HALF, BLOCK_N], c_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    r_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)   # one arrival from each consumer
    for i in gl.static_range(2):
        mbarrier.init(r_bar.index(i), count=1)
    fence_async_shared()

    flags = gl.allocate_shared_memory(gl.int8, [1 + A_KMAJOR, 1 << ACTIVATION, 1 + HAS_BIAS, 1 + HAS_RESIDUAL],
                                      gl.SwizzledSharedLayout(1, 1, 1, [3, 2, 1, 0]))

    consumer = (c_desc, r_desc, Bias, a_smem, b_smem, c_smem, flags, r_bar, ready, empty, M, N, K)
    tiling = (gl.to_tensor(GROUP_M), gl.to_tensor(NUM_PROGRAMS))
    gl.warp_specialize([
        (_consumer, consumer + (gl.to_tensor(0),) + tiling),
        (_consumer, consumer + (gl.to_tensor(1),) + tiling),
        (_producer, (a_desc, b_desc, a_smem, b_smem, c_smem, flags, ready, empty, M, N, K) + tiling),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


# --------------------------------------------------------------------------- host
# Launched by gemm.matmul (gemm._PreparedWs) where a config's ``WS`` entry asks for it and the problem
# fits (gemm._ws_fits). BLOCK_M is 128: two consumer warpgroups of 64 rows. 3 stages of a 128x64 and a
# 64x256 slab (48 KiB each) and the two 64x256 staging buffers (64 KiB) fill 208 of the 227 KiB of an
# sm_90 CTA. Registers: two consumer warpgroups at 232 and the producer warp at 40 (2*128*232 + 32*40
# <= 65536). Cross-compiled (Triton 3.6), bias+gelu+residual spills 730 bytes (gemm.WS_SPILLING keeps it off this
# kernel); bias+gelu, which spilled 265 with the activation on the whole tile, spills none by column halves.
BLOCK_M = 128
DEFAULT = dict(BLOCK_N=256, BLOCK_K=64, GROUP_M=8, STAGES=3, CONSUMER_REGS=232, PRODUCER_REGS=40)


def compile_specs(target=None) -> list:
    """sm_90 specializations: plain in both operand layouts, and the Llama/seed epilogues."""
    from flyarray.targets import KernelSpec
    if target not in (None, "sm_90"):
        return []
    specs = []
    for name, dtype, a_k, b_k, bias, act, res in (
            ("gemm_ws_bf16_kk", "bf16", True, True, False, 0, False),
            ("gemm_ws_bf16_kn", "bf16", True, False, False, 0, False),
            ("gemm_ws_bf16_mn", "bf16", False, False, False, 0, False),
            ("gemm_ws_fp16_kk_bias", "fp16", True, True, True, 0, False),
            ("gemm_ws_bf16_kk_residual", "bf16", True, True, False, 0, True),
            ("gemm_ws_fp16_kk_bias_gelu", "fp16", True, True, True, 2, False),
            ("gemm_ws_fp16_kk_bias_gelu_residual", "fp16", True, True, True, 2, True)):
        const = dict(A_KMAJOR=a_k, B_KMAJOR=b_k, HAS_BIAS=bias, ACTIVATION=act, HAS_RESIDUAL=res,
                     NUM_PROGRAMS=132, num_warps=4,
                     **{k: DEFAULT[k] for k in ("BLOCK_N", "BLOCK_K", "GROUP_M", "STAGES", "CONSUMER_REGS",
                                                "PRODUCER_REGS")})
        signature = {arg: "constexpr" if arg in const else f"*{dtype}" if arg in ("A", "B", "C", "Bias", "Res")
                     else "i32" for arg in _gemm_ws_kernel.arg_names}
        specs.append(KernelSpec(name, _gemm_ws_kernel, signature, const, 4, 1, ("s_a", "s_b", "s_c", "s_r")))
    return specs
