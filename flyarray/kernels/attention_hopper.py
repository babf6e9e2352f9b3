"""Attention kernels for Hopper (sm_90) in Gluon: the forward (asynchronous wgmma, software-pipelined)
and the backward's dk/dv (below the forward).

Triton's ``tl.dot`` on sm_90 waits for each q.k^T wgmma right after issuing it, so a warpgroup's
tensor-core time and its softmax (exp2 on the CUDA cores) run one after the other (Triton 3.6's
warp specialization, which would overlap them, gives wrong results on sm_90). Gluon exposes the
wgmma's commit groups, so this kernel overlaps them inside one warpgroup (FlashAttention-3's
"intra-warpgroup" pipelining). Key block j's step, with s_j (its scores) already in registers:

    1. issue s_{j+1} = q . k_{j+1}^T              (async; in flight: pv_{j-1}, s_{j+1})
    2. the online softmax of s_j -> p_j, alpha    (CUDA cores, while the tensor cores work)
    3. wait for pv_{j-1}; acc *= alpha; the slot of block j-1 is free: TMA-load block j-1+STAGES
    4. issue acc += p_j . v_j                     (async, p_j from registers)
    5. wait for s_{j+1}                           (pv_j stays in flight)

q, k and v move through TMA: one 2-D device-side descriptor per (batch, head) slice, so rows past
Sq/Sk read as zero and the output's rows past Sq are not written, whatever the strides. Each slot
of a STAGES-deep ring holds one key block's k and v under one mbarrier. Semantics are
``attention._attn_fwd_kernel``'s (layout (B, S, H, D), GQA, bottom-right causal, empty rows 0 with
lse -inf), restricted to fp16/bf16, head_dim 64/128, no bias/mask, scale > 0 (the host checks).

Gluon is Triton's explicit-layout dialect; this module compiles on any machine (``compile_specs``
cross-compiles it), but runs only on an sm_90 GPU: Triton's interpreter does not run Gluon.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_init, warpgroup_mma_wait)

# Names that moved between Triton 3.6 (the H200's) and 3.9 (CI's).
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier
_reinterpret = getattr(gl.shared_memory_descriptor, "reinterpret", None) or gl.shared_memory_descriptor._reinterpret


@gluon.constexpr_function
def _mma_layout(num_warps, n):
    """The wgmma accumulator layout of a [64 * num_warps / 4, n] tile: each warpgroup owns 64 rows."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, n, 16])


@gluon.constexpr_function
def _smem_layout(rows, cols, dtype):
    return gl.NVMMASharedLayout.get_default_for([rows, cols], dtype)


@gluon.jit
def _slice_descriptor(base, rows, row_stride, BLOCK: gl.constexpr, HEAD_DIM: gl.constexpr):
    """A [rows, HEAD_DIM] descriptor of one (batch, head) slice, fetched in [BLOCK, HEAD_DIM] boxes."""
    return tma.make_tensor_descriptor(base, shape=[rows, HEAD_DIM], strides=[row_stride, 1],
                                      block_shape=[BLOCK, HEAD_DIM],
                                      layout=_smem_layout(BLOCK, HEAD_DIM, base.dtype.element_ty))


@gluon.jit
def _init_barriers(STAGES: gl.constexpr):
    """(one mbarrier for the operand loaded once, a ring of STAGES for the streamed blocks), initialised
    and fenced so that TMA (the async proxy) sees them."""
    once = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ring = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(once, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ring.index(i), count=1)
    fence_async_shared()
    return once, ring


@gluon.jit
def _invalidate_barriers(once, ring, STAGES: gl.constexpr):
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ring.index(i))
    mbarrier.invalidate(once)


@gluon.jit
def _load_pair(a_desc, b_desc, a_smem, b_smem, ready, it, n_iters, first_block, BLOCK: gl.constexpr,
               STAGES: gl.constexpr):
    """TMA-load block ``first_block + it`` of two operands (k and v; q and do) into ring slot
    it % STAGES under its one mbarrier; nothing from the n_iters-th on."""
    slot = it % STAGES
    pred = it < n_iters
    bar = ready.index(slot)
    row = (first_block + it) * BLOCK
    mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=pred)
    _tma_load(a_desc, [row, 0], bar, a_smem.index(slot), pred=pred)
    _tma_load(b_desc, [row, 0], bar, b_smem.index(slot), pred=pred)


@gluon.jit
def _issue_scores(q_smem, k_smem, ready, block, n_blocks, s_layout: gl.constexpr, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """Wait for key block ``block`` to land, then issue q . k^T for it (async). Past the last block
    nothing is waited for and the slot's stale keys give scores nobody reads."""
    slot = block % STAGES
    mbarrier.wait(ready.index(slot), (block // STAGES) & 1, pred=block < n_blocks)
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    return warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)


@gluon.jit
def _fwd_slices(Q, K, V, Out, sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sob, sos, soh, Hq, Sq, Sk, kv_group,
                IS_CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, Q_ROWS: gl.constexpr,
                BLOCK_N: gl.constexpr):
    """This program's (batch * head, first query row, q/k/v/out descriptors fetching Q_ROWS query rows and
    BLOCK_N key rows a box); causal programs run the heaviest query blocks first."""
    pid_m = gl.program_id(0)
    if IS_CAUSAL:
        pid_m = gl.num_programs(0) - 1 - pid_m
    pid_bh = gl.program_id(1)
    b = (pid_bh // Hq).to(gl.int64)
    h = pid_bh % Hq
    hk = (h // kv_group).to(gl.int64)
    h = h.to(gl.int64)
    q_desc = _slice_descriptor(Q + b * sqb + h * sqh, Sq, sqs, Q_ROWS, HEAD_DIM)
    k_desc = _slice_descriptor(K + b * skb + hk * skh, Sk, sks, BLOCK_N, HEAD_DIM)
    v_desc = _slice_descriptor(V + b * svb + hk * svh, Sk, svs, BLOCK_N, HEAD_DIM)
    o_desc = _slice_descriptor(Out + b * sob + h * soh, Sq, sos, Q_ROWS, HEAD_DIM)
    return pid_bh, pid_m * BLOCK_M, q_desc, k_desc, v_desc, o_desc


@gluon.jit
def _fwd_key_blocks(m0, Sq, Sk, IS_CAUSAL, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """(key blocks the query block [m0, m0 + BLOCK_M) reads, the first of them that needs the bounds or
    causal mask): causal aligns bottom-right (query i sees keys <= i + Sk - Sq). ``IS_CAUSAL`` is a
    constexpr or (in a partition, which takes none) a run-time flag."""
    causal_offset = Sk - Sq
    hi = Sk
    if IS_CAUSAL:
        hi = gl.maximum(gl.minimum(Sk, m0 + BLOCK_M + causal_offset), 0)
    first_masked = Sk // BLOCK_N
    if IS_CAUSAL:
        first_masked = gl.minimum(first_masked, gl.maximum(m0 + causal_offset + 1, 0) // BLOCK_N)
    return gl.cdiv(hi, BLOCK_N), first_masked


@gluon.jit
def _online_softmax(s, m_i, l_i, j, first_masked, rows, offs_n, Sk, causal_offset, causal, qk_scale_log2,
                    BLOCK_N: gl.constexpr):
    """Key block j's step of the online softmax: (p, alpha, m_i, l_i) from its scores ``s``, masked from
    block ``first_masked`` on (keys past Sk; with ``causal``, a constexpr or a run-time flag, keys past
    each row's diagonal). ``offs_n`` None: the column offsets are made where the mask needs them (held
    across the loop they cost 32 registers a thread)."""
    if j >= first_masked:
        if offs_n is None:
            cols = j * BLOCK_N + gl.arange(0, BLOCK_N, gl.SliceLayout(0, s.type.layout))
        else:
            cols = j * BLOCK_N + offs_n
        keep = (cols[None, :] < Sk) & ((cols[None, :] <= rows[:, None] + causal_offset) | (not causal))
        s = gl.where(keep, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale_log2)
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)   # a row with no key yet: exp2 -> 0, not NaN
    p = gl.exp2(s * qk_scale_log2 - m_use[:, None])
    alpha = gl.exp2(m_i - m_use)
    return p, alpha, m_new, l_i * alpha + gl.sum(p, 1)


@gluon.jit
def _store_lse(Lse, pid_bh, Sq, rows, m_i, l_i):
    """The rows' log-sum-exp stored (natural log; -inf for a row that saw no key) and the divisor of their
    output (1 where no key: the output stays 0)."""
    seen = l_i > 0.0
    l_safe = gl.where(seen, l_i, 1.0)
    lse = gl.where(seen, (m_i + gl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    gl.store(Lse + pid_bh.to(gl.int64) * Sq + rows, lse, mask=rows < Sq)
    return l_safe


@gluon.jit
def _attn_fwd_hopper_kernel(
    Q, K, V, Out, Lse,
    sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sob, sos, soh,
    Hq, Sq, Sk, kv_group, qk_scale_log2,
    IS_CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr, num_warps: gl.constexpr,
):
    gl.static_assert(STAGES >= 3, "block j+1 is loaded while block j-1 is still read: 3 slots at least")
    s_layout: gl.constexpr = _mma_layout(num_warps, BLOCK_N)
    o_layout: gl.constexpr = _mma_layout(num_warps, HEAD_DIM)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    dtype: gl.constexpr = Q.dtype.element_ty

    pid_bh, m0, q_desc, k_desc, v_desc, o_desc = _fwd_slices(
        Q, K, V, Out, sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sob, sos, soh, Hq, Sq, Sk, kv_group,
        IS_CAUSAL, HEAD_DIM, BLOCK_M, BLOCK_M, BLOCK_N)
    n_blocks, first_masked = _fwd_key_blocks(m0, Sq, Sk, IS_CAUSAL, BLOCK_M, BLOCK_N)
    causal_offset = Sk - Sq

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar, ready = _init_barriers(STAGES)

    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    _tma_load(q_desc, [m0, 0], q_bar, q_smem)
    for i in gl.static_range(STAGES):
        _load_pair(k_desc, v_desc, k_smem, v_smem, ready, i, n_blocks, 0, BLOCK_N, STAGES)
    mbarrier.wait(q_bar, 0)

    rows = m0 + gl.arange(0, BLOCK_M, s_rows)
    offs_n = gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_layout))
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, s_rows)
    l_i = gl.zeros([BLOCK_M], gl.float32, s_rows)
    # acc and p_op are carried as in-flight wgmma operands: p_op, read from registers by pv_j, stays
    # alive (a dependency of the wait) until pv_j is known to be done
    acc = warpgroup_mma_init(gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout))
    p_op = gl.zeros([BLOCK_M, BLOCK_N], dtype, p_layout)

    s = _issue_scores(q_smem, k_smem, ready, 0, n_blocks, s_layout, BLOCK_M, BLOCK_N, STAGES)
    s = warpgroup_mma_wait(0, deps=(s,))
    for j in range(0, n_blocks):
        s_next = _issue_scores(q_smem, k_smem, ready, j + 1, n_blocks, s_layout, BLOCK_M, BLOCK_N, STAGES)

        p, alpha, m_i, l_i = _online_softmax(s, m_i, l_i, j, first_masked, rows, offs_n, Sk, causal_offset,
                                             IS_CAUSAL, qk_scale_log2, BLOCK_N)

        acc, p_op = warpgroup_mma_wait(1, deps=(acc, p_op))     # pv_{j-1} done; s_{j+1} may run on
        acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
        if j >= 1:
            _cta_barrier()    # every warpgroup is past pv_{j-1}: block j-1's slot can be refilled
            _load_pair(k_desc, v_desc, k_smem, v_smem, ready, j - 1 + STAGES, n_blocks, 0, BLOCK_N, STAGES)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        acc = warpgroup_mma(p_op, v_smem.index(j % STAGES), acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s_next,))
    acc = warpgroup_mma_wait(0, deps=(acc,))

    _invalidate_barriers(q_bar, ready, STAGES)

    l_safe = _store_lse(Lse, pid_bh, Sq, rows, m_i, l_i)
    out = acc / gl.convert_layout(l_safe, o_rows)[:, None]
    q_smem.store(out.to(dtype))    # q is no longer read: its buffer stages the output for TMA
    fence_async_shared()
    _tma_store(o_desc, [m0, 0], q_smem)
    tma.store_wait(0)


# ---------------------------------------------------------------------------
# Forward, warp-specialized (FlashAttention-3's structure; from 4096 keys until the persistent form below)
# ---------------------------------------------------------------------------
# The forward above holds its two warpgroups in step: its main loop has five CTA-wide barriers a key
# block (docs/kernels.md). Here a one-warp producer partition alone issues the TMA loads, and each
# 64-row half of the query block is its own consumer partition (four warps, one warpgroup): a consumer
# waits only on the "ready" mbarrier of a slot and arrives on its "empty" one (two arrivals free it),
# so nothing in a consumer's loop waits for the other warpgroup.
@gluon.jit
def _ws_producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, ready, empty, m0, n_blocks):
    HALF: gl.constexpr = q_smem.shape[1]
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    for h in gl.static_range(2):
        mbarrier.expect(q_bars.index(h), q_desc.block_type.nbytes)
        _tma_load(q_desc, [m0 + h * HALF, 0], q_bars.index(h), q_smem.index(h))
    for j in range(0, n_blocks):
        slot = j % STAGES
        # the slot's previous block (j - STAGES) must be released by both consumers; the first round
        # of waits passes at once (parity 1 of a fresh barrier)
        mbarrier.wait(empty.index(slot), ((j // STAGES) & 1) ^ 1)
        bar = ready.index(slot)
        mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        _tma_load(k_desc, [j * BLOCK_N, 0], bar, k_smem.index(slot))
        _tma_load(v_desc, [j * BLOCK_N, 0], bar, v_smem.index(slot))


@gluon.jit
def _ws_consumer(o_desc, Lse, q_smem, k_smem, v_smem, q_bars, ready, empty, pid_bh, m0, Sq, Sk, n_blocks,
                 first_masked, qk_scale_log2, causal, half_index):
    """One 64-row half (``half_index``) of the query block: _attn_fwd_hopper_kernel's loop for one
    warpgroup, with the slot handed back through ``empty`` instead of a CTA barrier. Sizes come from the
    shared buffers' shapes and the flags as run-time values (a partition takes no constexpr arguments)."""
    HALF: gl.constexpr = q_smem.shape[1]
    HEAD_DIM: gl.constexpr = q_smem.shape[2]
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    s_layout: gl.constexpr = _mma_layout(4, BLOCK_N)
    o_layout: gl.constexpr = _mma_layout(4, HEAD_DIM)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    dtype: gl.constexpr = q_smem.dtype
    q_tile = q_smem.index(half_index)
    mbarrier.wait(q_bars.index(half_index), 0)

    first = m0 + half_index * HALF
    rows = first + gl.arange(0, HALF, s_rows)
    offs_n = gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_layout))
    causal_offset = Sk - Sq
    m_i = gl.full([HALF], float("-inf"), gl.float32, s_rows)
    l_i = gl.zeros([HALF], gl.float32, s_rows)
    acc = warpgroup_mma_init(gl.zeros([HALF, HEAD_DIM], gl.float32, o_layout))
    p_op = gl.zeros([HALF, BLOCK_N], dtype, p_layout)

    s = _issue_scores(q_tile, k_smem, ready, 0, n_blocks, s_layout, HALF, BLOCK_N, STAGES)
    s = warpgroup_mma_wait(0, deps=(s,))
    for j in range(0, n_blocks):
        s_next = _issue_scores(q_tile, k_smem, ready, j + 1, n_blocks, s_layout, HALF, BLOCK_N, STAGES)
        p, alpha, m_i, l_i = _online_softmax(s, m_i, l_i, j, first_masked, rows, offs_n, Sk, causal_offset,
                                             causal != 0, qk_scale_log2, BLOCK_N)

        acc, p_op = warpgroup_mma_wait(1, deps=(acc, p_op))     # pv_{j-1} done: its slot is free
        mbarrier.arrive(empty.index((j + STAGES - 1) % STAGES), pred=j >= 1)
        acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        acc = warpgroup_mma(p_op, v_smem.index(j % STAGES), acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s_next,))
    acc = warpgroup_mma_wait(0, deps=(acc,))

    l_safe = _store_lse(Lse, pid_bh, Sq, rows, m_i, l_i)
    out = acc / gl.convert_layout(l_safe, o_rows)[:, None]
    q_tile.store(out.to(dtype))    # this half's q is no longer read: it stages the output for TMA
    fence_async_shared()
    _tma_store(o_desc, [first, 0], q_tile)
    tma.store_wait(0)


@gluon.jit
def _attn_fwd_hopper_ws_kernel(
    Q, K, V, Out, Lse,
    sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sob, sos, soh,
    Hq, Sq, Sk, kv_group, qk_scale_log2,
    IS_CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr, num_warps: gl.constexpr,
):
    """_attn_fwd_hopper_kernel's semantics (BLOCK_M = 128: two 64-row halves), warp-specialized:
    launched with num_warps=4 (the first consumer); the second consumer (4 warps) and the producer
    (1 warp) are worker partitions."""
    gl.static_assert(BLOCK_M == 128, "two consumer warpgroups of 64 rows")
    gl.static_assert(num_warps == 4, "the default partition is one consumer warpgroup")
    gl.static_assert(STAGES >= 3, "a consumer waits for block j+1 before it releases block j-1")
    HALF: gl.constexpr = BLOCK_M // 2
    dtype: gl.constexpr = Q.dtype.element_ty

    pid_bh, m0, q_desc, k_desc, v_desc, o_desc = _fwd_slices(
        Q, K, V, Out, sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sob, sos, soh, Hq, Sq, Sk, kv_group,
        IS_CAUSAL, HEAD_DIM, BLOCK_M, HALF, BLOCK_N)
    n_blocks, first_masked = _fwd_key_blocks(m0, Sq, Sk, IS_CAUSAL, BLOCK_M, BLOCK_N)

    q_smem = gl.allocate_shared_memory(dtype, [2, HALF, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_bars.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)   # one arrival from each consumer
    fence_async_shared()

    consumer_args = (o_desc, Lse, q_smem, k_smem, v_smem, q_bars, ready, empty, pid_bh, m0, Sq, Sk, n_blocks,
                     first_masked, qk_scale_log2)
    causal = gl.to_tensor(IS_CAUSAL).to(gl.int32)
    gl.warp_specialize([
        (_ws_consumer, consumer_args + (causal, gl.to_tensor(0))),
        (_ws_consumer, consumer_args + (causal, gl.to_tensor(1))),
        (_ws_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, ready, empty, m0, n_blocks)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


# ---------------------------------------------------------------------------
# Forward, warp-specialized and persistent (the sm_90 default at hd128 from 2048 keys, with PINGPONG)
# ---------------------------------------------------------------------------
# The kernel above pays, for every 128-row query block, its own start (descriptors built in global
# memory, q and the first key blocks loaded) and end (the output staged through shared memory), with
# nothing else on its SM to hide them: one such CTA fills an SM (225 KiB of shared memory, 240-register
# consumers). At 2048 keys (causal: 8.5 key blocks a query block on average) that exposed start and end
# is a large share. Here the grid is one program per SM looping over query blocks ("tiles"); the producer
# runs ahead into the next tile (its q as soon as the consumers' last q.k^T is done, its keys as slots
# free up) while the consumers normalise and store the current one straight from registers (the q
# buffer is not borrowed for staging, so the next q can land during the store). Which tiles a program
# runs, in which order, is a table the host builds once per shape (attention._persistent_schedule: heavy
# causal tiles first, heads grouped so their keys stay in L2, programs balanced). Descriptors are built
# once per program, 4-D over (batch, sequence, head, head_dim), so every (batch, head) slice is a box of
# one descriptor: rows past Sq/Sk still read as zero.
@gluon.constexpr_function
def _box_layout(rows, cols, dtype):
    """The shared layout of a [1, rows, 1, cols] box of a (B, S, H, D) descriptor: the [rows, cols] tile's."""
    return gl.NVMMASharedLayout.get_default_for([1, rows, 1, cols], dtype)


@gluon.jit
def _box(tile):
    """A [rows, cols] shared tile seen as the [1, rows, 1, cols] box a 4-D TMA copy writes (same bytes)."""
    ROWS: gl.constexpr = tile.shape[0]
    COLS: gl.constexpr = tile.shape[1]
    return _reinterpret(tile, tile.dtype, [1, ROWS, 1, COLS], _box_layout(ROWS, COLS, tile.dtype))


@gluon.jit
def _bshd_descriptor(base, batches, rows, heads, sb, ss, sh, BLOCK: gl.constexpr, HEAD_DIM: gl.constexpr):
    """A 4-D descriptor of a (B, S, H, D) tensor fetching [1, BLOCK, 1, HEAD_DIM] boxes."""
    return tma.make_tensor_descriptor(base, shape=[batches, rows, heads, HEAD_DIM], strides=[sb, ss, sh, 1],
                                      block_shape=[1, BLOCK, 1, HEAD_DIM],
                                      layout=_box_layout(BLOCK, HEAD_DIM, base.dtype.element_ty))


@gluon.jit
def _tile_range(Tiles):
    """This program's tiles: [first, end) of the schedule's codes (``attention._persistent_schedule``)."""
    p = gl.program_id(0)
    return gl.load(Tiles + p), gl.load(Tiles + p + 1)


@gluon.jit
def _tile(Tiles, k, bh_count, BLOCK_M: gl.constexpr):
    """The k-th tile code of the schedule: (its first query row, its batch * query head)."""
    code = gl.load(Tiles + gl.num_programs(0) + 1 + k)
    return (code // bh_count) * BLOCK_M, code % bh_count


@gluon.jit
def _tile_start(m0, Sq, Sk, causal, half_index, HALF: gl.constexpr, BLOCK_N: gl.constexpr,
                s_layout: gl.constexpr):
    """A consumer's start of the tile at query row m0: (key blocks, first masked block, its first row, its
    rows, the running max and sum of its online softmax)."""
    n_blocks, first_masked = _fwd_key_blocks(m0, Sq, Sk, causal != 0, 2 * HALF, BLOCK_N)
    first = m0 + half_index * HALF
    rows = first + gl.arange(0, HALF, gl.SliceLayout(1, s_layout))
    m_i = gl.full([HALF], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([HALF], gl.float32, gl.SliceLayout(1, s_layout))
    return n_blocks, first_masked, first, rows, m_i, l_i


@gluon.jit
def _store_tile(Out, Lse, acc, m_i, l_i, rows, first, bh, Hq, Sq, sob, sos, soh):
    """A consumer's end of a tile: its rows' lse, and its output (acc / l) stored from registers (rows past
    Sq are not written)."""
    HALF: gl.constexpr = acc.shape[0]
    HEAD_DIM: gl.constexpr = acc.shape[1]
    o_layout: gl.constexpr = acc.type.layout
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    l_safe = _store_lse(Lse, bh, Sq, rows, m_i, l_i)
    out = (acc / gl.convert_layout(l_safe, o_rows)[:, None]).to(Out.dtype.element_ty)
    out_rows = first + gl.arange(0, HALF, o_rows)
    offs_d = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, o_layout))
    base = Out + (bh // Hq).to(gl.int64) * sob + (bh % Hq).to(gl.int64) * soh
    ptrs = base + out_rows.to(gl.int64)[:, None] * sos + offs_d[None, :]
    gl.store(ptrs, out, mask=(out_rows[:, None] < Sq) & (offs_d[None, :] < HEAD_DIM))


@gluon.jit
def _pws_producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, ready, empty, Tiles,
                  Hq, Sq, Sk, kv_group, bh_count, causal):
    HALF: gl.constexpr = q_smem.shape[1]
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    first, end = _tile_range(Tiles)
    it = 0    # key blocks loaded so far, over all tiles: the ring's position
    tc = 0    # tiles started so far: the q barriers' phase
    for k in range(first, end):
        m0, bh = _tile(Tiles, k, bh_count, 2 * HALF)
        b = bh // Hq
        h = bh % Hq
        n_blocks, _ = _fwd_key_blocks(m0, Sq, Sk, causal != 0, 2 * HALF, BLOCK_N)
        for half in gl.static_range(2):
            # the consumer of this half has issued its last q.k^T of the previous tile and waited for it
            mbarrier.wait(q_empty.index(half), (tc & 1) ^ 1)
            mbarrier.expect(q_ready.index(half), q_desc.block_type.nbytes)
            _tma_load(q_desc, [b, m0 + half * HALF, h, 0], q_ready.index(half), _box(q_smem.index(half)))
        for j in range(0, n_blocks):
            slot = it % STAGES
            mbarrier.wait(empty.index(slot), ((it // STAGES) & 1) ^ 1)
            bar = ready.index(slot)
            mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
            _tma_load(k_desc, [b, j * BLOCK_N, h // kv_group, 0], bar, _box(k_smem.index(slot)))
            _tma_load(v_desc, [b, j * BLOCK_N, h // kv_group, 0], bar, _box(v_smem.index(slot)))
            it += 1
        tc += 1


@gluon.jit
def _pws_consumer(Out, Lse, q_smem, k_smem, v_smem, q_ready, q_empty, ready, empty, Tiles, sob, sos, soh,
                  Hq, Sq, Sk, bh_count, qk_scale_log2, causal, half_index):
    """One 64-row half of every tile of this program: _ws_consumer's key loop, with the ring position
    carried across tiles, the q buffer handed back after the last q.k^T, and the output stored from
    registers."""
    HALF: gl.constexpr = q_smem.shape[1]
    HEAD_DIM: gl.constexpr = q_smem.shape[2]
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    s_layout: gl.constexpr = _mma_layout(4, BLOCK_N)
    o_layout: gl.constexpr = _mma_layout(4, HEAD_DIM)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    dtype: gl.constexpr = q_smem.dtype
    q_tile = q_smem.index(half_index)
    causal_offset = Sk - Sq
    first_tile, end = _tile_range(Tiles)
    it = 0
    tc = 0
    for k in range(first_tile, end):
        m0, bh = _tile(Tiles, k, bh_count, 2 * HALF)
        n_blocks, first_masked, first, rows, m_i, l_i = _tile_start(m0, Sq, Sk, causal, half_index, HALF, BLOCK_N,
                                                                    s_layout)
        acc = warpgroup_mma_init(gl.zeros([HALF, HEAD_DIM], gl.float32, o_layout))
        p_op = gl.zeros([HALF, BLOCK_N], dtype, p_layout)
        mbarrier.wait(q_ready.index(half_index), tc & 1)

        last = it + n_blocks
        s = _issue_scores(q_tile, k_smem, ready, it, last, s_layout, HALF, BLOCK_N, STAGES)
        s = warpgroup_mma_wait(0, deps=(s,))
        for j in range(0, n_blocks):
            s_next = _issue_scores(q_tile, k_smem, ready, it + j + 1, last, s_layout, HALF, BLOCK_N, STAGES)
            p, alpha, m_i, l_i = _online_softmax(s, m_i, l_i, j, first_masked, rows, None, Sk,
                                                 causal_offset, causal != 0, qk_scale_log2, BLOCK_N)
            acc, p_op = warpgroup_mma_wait(1, deps=(acc, p_op))     # pv_{j-1} done: its slot is free
            mbarrier.arrive(empty.index((it + j + STAGES - 1) % STAGES), pred=j >= 1)
            acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
            p_op = gl.convert_layout(p.to(dtype), p_layout)
            acc = warpgroup_mma(p_op, v_smem.index((it + j) % STAGES), acc, is_async=True)
            s = warpgroup_mma_wait(1, deps=(s_next,))
        acc = warpgroup_mma_wait(0, deps=(acc,))
        # q and the last key block are no longer read (the scores issued past the last block, which
        # nobody reads, were waited for above): the producer may refill both
        mbarrier.arrive(q_empty.index(half_index))
        mbarrier.arrive(empty.index((last + STAGES - 1) % STAGES), pred=n_blocks > 0)

        _store_tile(Out, Lse, acc, m_i, l_i, rows, first, bh, Hq, Sq, sob, sos, soh)
        it = last
        tc += 1


@gluon.jit
def _pws_consumer_pingpong(Out, Lse, q_smem, k_smem, v_smem, q_ready, q_empty, ready, empty, Tiles, sob, sos, soh,
                           Hq, Sq, Sk, bh_count, qk_scale_log2, causal, half_index, turn):
    """_pws_consumer with FlashAttention-3's ping-pong: the two consumers take turns (``turn``, one mbarrier
    each) to issue their two matmuls of a step back to back, so one's softmax runs while the other's
    matmuls occupy the tensor cores. A step j issues s_{j+1} = q.k_{j+1}^T and acc += p_j.v_j, then runs
    the softmax of s_{j+1} under them, then waits for p_j.v_j and rescales. The step past the last block
    reads a stale slot whose scores the causal/bounds mask turns all to -inf: p = 0, alpha = 1."""
    HALF: gl.constexpr = q_smem.shape[1]
    HEAD_DIM: gl.constexpr = q_smem.shape[2]
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    s_layout: gl.constexpr = _mma_layout(4, BLOCK_N)
    o_layout: gl.constexpr = _mma_layout(4, HEAD_DIM)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    dtype: gl.constexpr = q_smem.dtype
    q_tile = q_smem.index(half_index)
    causal_offset = Sk - Sq
    first_tile, end = _tile_range(Tiles)
    it = 0
    tc = 0
    turns = 0
    for k in range(first_tile, end):
        m0, bh = _tile(Tiles, k, bh_count, 2 * HALF)
        n_blocks, first_masked, first, rows, m_i, l_i = _tile_start(m0, Sq, Sk, causal, half_index, HALF, BLOCK_N,
                                                                    s_layout)
        acc = gl.zeros([HALF, HEAD_DIM], gl.float32, o_layout)
        mbarrier.wait(q_ready.index(half_index), tc & 1)

        last = it + n_blocks
        s = _issue_scores(q_tile, k_smem, ready, it, last, s_layout, HALF, BLOCK_N, STAGES)
        s = warpgroup_mma_wait(0, deps=(s,))
        p, alpha, m_i, l_i = _online_softmax(s, m_i, l_i, 0, first_masked, rows, None, Sk, causal_offset,
                                             causal != 0, qk_scale_log2, BLOCK_N)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        for j in range(0, n_blocks):
            mbarrier.wait(turn.index(half_index), turns & 1)
            s_next = _issue_scores(q_tile, k_smem, ready, it + j + 1, last, s_layout, HALF, BLOCK_N, STAGES)
            acc = warpgroup_mma(p_op, v_smem.index((it + j) % STAGES), acc, is_async=True)
            mbarrier.arrive(turn.index(1 - half_index))
            turns += 1
            s = warpgroup_mma_wait(1, deps=(s_next,))
            p, alpha, m_i, l_i = _online_softmax(s, m_i, l_i, j + 1, first_masked, rows, None, Sk,
                                                 causal_offset, causal != 0, qk_scale_log2, BLOCK_N)
            p_next = gl.convert_layout(p.to(dtype), p_layout)    # narrowed before the wait: fewer registers
            acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
            mbarrier.arrive(empty.index((it + j) % STAGES))      # p_j.v_j done: block j's slot is free
            acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
            p_op = p_next
        mbarrier.arrive(q_empty.index(half_index))

        _store_tile(Out, Lse, acc, m_i, l_i, rows, first, bh, Hq, Sq, sob, sos, soh)
        it = last
        tc += 1


@gluon.jit
def _attn_fwd_hopper_persistent_kernel(
    Q, K, V, Out, Lse,
    sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sob, sos, soh,
    Hq, Sq, Sk, kv_group, qk_scale_log2, Tiles, bh_count,
    IS_CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr, PINGPONG: gl.constexpr,
    num_warps: gl.constexpr,
):
    """_attn_fwd_hopper_ws_kernel's semantics and partitions, persistent: launched with one program per
    SM at most, each looping over the tiles ``Tiles`` gives it (``attention._persistent_schedule``: int32,
    G + 1 offsets then the tile codes m_block * bh_count + batch * Hq + head; ``bh_count`` = batch * Hq)."""
    gl.static_assert(BLOCK_M == 128, "two consumer warpgroups of 64 rows")
    gl.static_assert(num_warps == 4, "the default partition is one consumer warpgroup")
    gl.static_assert(STAGES >= 3, "a consumer waits for block j+1 before it releases block j-1")
    HALF: gl.constexpr = BLOCK_M // 2
    dtype: gl.constexpr = Q.dtype.element_ty
    batches = bh_count // Hq
    q_desc = _bshd_descriptor(Q, batches, Sq, Hq, sqb, sqs, sqh, HALF, HEAD_DIM)
    k_desc = _bshd_descriptor(K, batches, Sk, Hq // kv_group, skb, sks, skh, BLOCK_N, HEAD_DIM)
    v_desc = _bshd_descriptor(V, batches, Sk, Hq // kv_group, svb, svs, svh, BLOCK_N, HEAD_DIM)

    q_smem = gl.allocate_shared_memory(dtype, [2, HALF, HEAD_DIM], _smem_layout(HALF, HEAD_DIM, dtype))
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], _smem_layout(BLOCK_N, HEAD_DIM, dtype))
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], _smem_layout(BLOCK_N, HEAD_DIM, dtype))
    q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)   # one arrival from each consumer
    fence_async_shared()

    causal = gl.to_tensor(IS_CAUSAL).to(gl.int32)
    consumer_args = (Out, Lse, q_smem, k_smem, v_smem, q_ready, q_empty, ready, empty, Tiles, sob, sos, soh,
                     Hq, Sq, Sk, bh_count, qk_scale_log2, causal)
    producer_args = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, ready, empty, Tiles,
                     Hq, Sq, Sk, kv_group, bh_count, causal)
    if PINGPONG:
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(turn.index(i), count=1)
        fence_async_shared()
        mbarrier.arrive(turn.index(0))     # the first consumer has the first turn
        gl.warp_specialize([
            (_pws_consumer_pingpong, consumer_args + (gl.to_tensor(0), turn)),
            (_pws_consumer_pingpong, consumer_args + (gl.to_tensor(1), turn)),
            (_pws_producer, producer_args),
        ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([
            (_pws_consumer, consumer_args + (gl.to_tensor(0),)),
            (_pws_consumer, consumer_args + (gl.to_tensor(1),)),
            (_pws_producer, producer_args),
        ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


# ---------------------------------------------------------------------------
# Backward, dk/dv (multi-head attention: one query head per kv head)
# ---------------------------------------------------------------------------
@gluon.jit
def _attn_bwd_dkdv_hopper_kernel(
    Q, K, V, DO, Lse2, Delta, DK, DV,
    sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sdob, sdos, sdoh, sdkb, sdks, sdkh, sdvb, sdvs, sdvh,
    Hq, Sq, Sk, sm_scale, qk_scale_log2,
    IS_CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr, num_warps: gl.constexpr,
):
    """dk, dv of one key block of one head, over the query blocks that see it (transposed scores, as
    ``attention._attn_bwd_dkdv_kernel``): per query block, s^T = k q^T and dp^T = v do^T are issued
    together (asynchronous wgmma, k and v resident in shared memory), then p^T = exp2(s^T - lse2),
    ds^T = p^T (dp^T - delta), and dv += p^T do, dk += ds^T q are left in flight (p^T, ds^T from
    registers) while the next query block's scores are issued. q and do arrive by TMA in a ring of
    STAGES slots. Lse2 (log2-domain lse, +inf for rows that saw no key) and Delta come from
    ``_attn_bwd_pre_kernel``."""
    gl.static_assert(STAGES >= 2, "a slot is refilled once the block before it is done")
    s_layout: gl.constexpr = _mma_layout(num_warps, BLOCK_M)        # [BLOCK_N, BLOCK_M] score tiles
    a_layout: gl.constexpr = _mma_layout(num_warps, HEAD_DIM)       # [BLOCK_N, HEAD_DIM] dk, dv
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=a_layout, k_width=2)
    cols_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    dtype: gl.constexpr = Q.dtype.element_ty

    pid_n = gl.program_id(0)
    pid_bh = gl.program_id(1)
    b = (pid_bh // Hq).to(gl.int64)
    h = (pid_bh % Hq).to(gl.int64)
    n0 = pid_n * BLOCK_N

    k_desc = _slice_descriptor(K + b * skb + h * skh, Sk, sks, BLOCK_N, HEAD_DIM)
    v_desc = _slice_descriptor(V + b * svb + h * svh, Sk, svs, BLOCK_N, HEAD_DIM)
    q_desc = _slice_descriptor(Q + b * sqb + h * sqh, Sq, sqs, BLOCK_M, HEAD_DIM)
    do_desc = _slice_descriptor(DO + b * sdob + h * sdoh, Sq, sdos, BLOCK_M, HEAD_DIM)
    dk_desc = _slice_descriptor(DK + b * sdkb + h * sdkh, Sk, sdks, BLOCK_N, HEAD_DIM)
    dv_desc = _slice_descriptor(DV + b * sdvb + h * sdvh, Sk, sdvs, BLOCK_N, HEAD_DIM)

    # query blocks from lo_block on see this key block; causal ones before first_full straddle the
    # diagonal and need its mask. Nothing else is masked: query rows past Sq have lse2 = +inf (p = 0)
    # and zero do, and key rows past Sk (zero k, v) only make dk/dv rows that the store clips.
    causal_offset = Sk - Sq
    lo_block = 0
    first_full = 0
    if IS_CAUSAL:
        lo_block = gl.maximum(n0 - causal_offset, 0) // BLOCK_M
        first_full = gl.cdiv(gl.maximum(n0 + BLOCK_N - 1 - causal_offset, 0), BLOCK_M)
    n_iters = gl.maximum(gl.cdiv(Sq, BLOCK_M) - lo_block, 0)

    k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
    kv_bar, ready = _init_barriers(STAGES)

    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    _tma_load(k_desc, [n0, 0], kv_bar, k_smem)
    _tma_load(v_desc, [n0, 0], kv_bar, v_smem)
    for i in gl.static_range(STAGES):
        _load_pair(q_desc, do_desc, q_smem, do_smem, ready, i, n_iters, lo_block, BLOCK_M, STAGES)
    mbarrier.wait(kv_bar, 0)

    keys = n0 + gl.arange(0, BLOCK_N, gl.SliceLayout(1, s_layout))
    offs_m = gl.arange(0, BLOCK_M, cols_layout)
    row_base = pid_bh.to(gl.int64) * Sq
    zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout)
    dk = warpgroup_mma_init(gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, a_layout))
    dv = warpgroup_mma_init(gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, a_layout))
    # p^T and ds^T feed dv and dk from registers: carried, and kept alive by the wait that covers them
    p_op = gl.zeros([BLOCK_N, BLOCK_M], dtype, op_layout)
    ds_op = gl.zeros([BLOCK_N, BLOCK_M], dtype, op_layout)
    for it in range(0, n_iters):
        slot = it % STAGES
        mbarrier.wait(ready.index(slot), (it // STAGES) & 1)
        s_t = warpgroup_mma(k_smem, q_smem.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
        dp_t = warpgroup_mma(v_smem, do_smem.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
        rows = (lo_block + it) * BLOCK_M + offs_m
        lse2 = gl.load(Lse2 + row_base + rows, mask=rows < Sq, other=float("inf"))
        delta = gl.load(Delta + row_base + rows, mask=rows < Sq, other=0.0)
        # dk/dv of the block before (in flight until now) and both score tiles done
        s_t, dp_t, dk, dv, p_op, ds_op = warpgroup_mma_wait(0, deps=(s_t, dp_t, dk, dv, p_op, ds_op))
        if it >= 1:
            _cta_barrier()    # every warpgroup is past block it-1: its slot can be refilled
            _load_pair(q_desc, do_desc, q_smem, do_smem, ready, it - 1 + STAGES, n_iters, lo_block, BLOCK_M,
                       STAGES)
        if IS_CAUSAL:
            if lo_block + it < first_full:
                s_t = gl.where(keys[:, None] <= rows[None, :] + causal_offset, s_t, float("-inf"))
        p_t = gl.exp2(s_t * qk_scale_log2 - lse2[None, :])
        ds_t = p_t * (dp_t - delta[None, :])
        p_op = gl.convert_layout(p_t.to(dtype), op_layout)
        ds_op = gl.convert_layout(ds_t.to(dtype), op_layout)
        dv = warpgroup_mma(p_op, do_smem.index(slot), dv, is_async=True)
        dk = warpgroup_mma(ds_op, q_smem.index(slot), dk, is_async=True)
    dk, dv = warpgroup_mma_wait(0, deps=(dk, dv))

    _invalidate_barriers(kv_bar, ready, STAGES)
    # k and v are no longer read: their buffers stage dk and dv for TMA (rows past Sk are clipped)
    k_smem.store((dk * sm_scale).to(dtype))
    v_smem.store(dv.to(dtype))
    fence_async_shared()
    _tma_store(dk_desc, [n0, 0], k_smem)
    _tma_store(dv_desc, [n0, 0], v_smem)
    tma.store_wait(0)
