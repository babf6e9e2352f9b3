"""Top-k along the last axis (as ``jax.lax.top_k``) and the fused MoE router (softmax + top-k).

Semantics, the same on every path and in ``reference_top_k``:

* ``top_k(x, k) -> (values, indices)``: the k largest entries of each row of the
  last axis, values descending, ``values.dtype == x.dtype``, indices **int32**.
  Any leading shape (rows are flattened); output shape ``x.shape[:-1] + (k,)``.
* Ties go to the **lower index** (equal values appear in index order).
* NaN ranks **above +inf** (as torch.topk and jax do); NaNs tie with each other
  (lower index first). ``-0.0`` and ``+0.0`` are **equal** (lower index first);
  the value returned is the element itself, so a -0.0 stays -0.0.
* dtypes: float16, bfloat16, float32, and the integers int8, uint8, int16, int32
  (compared exactly as integers). int64 and float64 are refused (their keys do
  not fit the 32-bit ordering key).
* ``softmax_top_k(logits, k, renormalize=False) -> (probs, indices)``: softmax
  over the whole row in fp32, then its top k. The selection is made on the
  logits (softmax is monotone, so this is the same set, and it cannot be upset
  by two logits rounding to one probability). A NaN anywhere in a row makes that
  row's probabilities NaN (as torch.softmax), a +inf makes them NaN too, an
  all -inf row gives NaN. ``renormalize=True`` divides the k probabilities by
  their sum (the usual MoE "norm_topk_prob"). Probabilities come back in the
  logits' dtype.

How it works. Every element becomes an order-preserving 32-bit key (floats:
flip the magnitude bits of negatives; every NaN becomes the top key; -0.0 is
folded onto +0.0), and a candidate is one signed 64-bit word
``key << 32 | (0xFFFFFFFF - column)``: a plain integer max picks the larger
value and, between equal values, the lower column. Two regimes:

* narrow rows (N <= ~1024, k <= 16: MoE routers): one kernel, several rows per
  program; k rounds of "row max of the keys, lowest column holding it, knock it out".
* wide rows (vocabularies, and everything else): the row is cut into chunks
  spread over many programs (64 rows x 16 chunks for 64x131072). A chunk keeps
  only what can be in its own top k: the k-th largest of its strided group
  maxima is a lower bound of its k-th largest element (k distinct elements
  reach it), found by a 32-step bitwise search over the few group maxima.
  What passes (about k for real data) is compacted with a prefix sum into CAP
  slots. If more than CAP pass (adversarial data, floods of ties), the exact
  k-th largest of the whole chunk is searched instead and ties at it are taken
  lowest column first, so the result never depends on the data being kind. A second
  kernel, one program per row, runs a bitonic top-k network over the
  candidates of its row and gathers the values.

Kernels call no other @triton.jit function (Triton's interpreter, which runs
them on the CPU, cannot), so reductions and scans go through ``tl.reduce`` and
``tl.associative_scan`` with Triton's own combine functions, and the bitonic
network is written out inline.
"""
from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from flyarray.kernels._triton import current_arch, next_pow2, pick_config, runner
from flyarray.targets import KernelSpec


@triton.jit
def order_key(x, IS_FLOAT: tl.constexpr):
    """An int32 whose signed order is ``x``'s order (top_k and sort compare these): a float's bits with
    the negative half flipped, -0.0 folded onto +0.0 and every NaN above +inf; integers as themselves
    (uint32 with its top bit flipped)."""
    if IS_FLOAT:
        bits = x.to(tl.float32).to(tl.int32, bitcast=True)
        key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
        key = tl.where(key == -1, 0, key)
        key = tl.where((bits & 0x7FFFFFFF) > 0x7F800000, 0x7FFFFFFF, key)
    elif x.dtype == tl.uint32:  # the top bit flipped: the unsigned order as a signed one
        key = (x ^ 0x80000000).to(tl.int32, bitcast=True)
    else:
        key = x.to(tl.int32)  # uint8/uint16 zero-extend
    return key


# chunk: elements of a wide row one program filters, at least chunk_per_kpad * kpad (large k).
# group_size: elements per strided group in the lower bound (fewer groups = cheaper
#   search, more candidates); groups are kept >= 4*kpad so the bound stays tight.
# chunk_elems_per_thread: sets the chunk kernel's warps (registers: ~160 a thread at 16).
# merge_warps: warps of the merge kernel (at most; fewer for few candidates).
# merge_max: most candidate words one merge program sorts; more go through a merge tree.
# digit_bits / search_bits: bits of the threshold settled per round of the search over the
#   group maxima, and how many of the key's top bits are searched at all.
# narrow_max_n / narrow_max_k: rows up to this length and k up to this take the one-kernel path.
# narrow_tile / narrow_warps: elements per program there (several short rows share a
#   program) and its warps; one warp keeps every row reduction a warp reduction (no barriers).
CONFIGS = {
    "sm_90": {  # 132 SMs: 64 rows x 32 chunks = 2048 programs of 8 warps, ~3 resident per SM
        "chunk": 4096, "chunk_per_kpad": 8, "group_size": 16, "chunk_elems_per_thread": 16,
        "merge_warps": 8, "merge_max": 4096, "digit_bits": 4, "search_bits": 16, "warp_size": 32,
        "narrow_max_n": 1024, "narrow_max_k": 16, "narrow_tile": 1024, "narrow_warps": 1,
    },
    "gfx950": {  # wave64: 4 waves = 256 lanes over a 4096 chunk, 16 elements a lane
        "chunk": 4096, "chunk_per_kpad": 8, "group_size": 16, "chunk_elems_per_thread": 16,
        "merge_warps": 8, "merge_max": 4096, "digit_bits": 4, "search_bits": 16, "warp_size": 64,
        "narrow_max_n": 1024, "narrow_max_k": 16, "narrow_tile": 1024, "narrow_warps": 1,
    },
    "default": {
        "chunk": 4096, "chunk_per_kpad": 8, "group_size": 16, "chunk_elems_per_thread": 16,
        "merge_warps": 8, "merge_max": 4096, "digit_bits": 4, "search_bits": 16, "warp_size": 32,
        "narrow_max_n": 1024, "narrow_max_k": 16, "narrow_tile": 1024, "narrow_warps": 1,
    },
}

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32,
                    torch.int8, torch.uint8, torch.int16, torch.int32)

# Triton's own combine functions: the interpreter recognizes exactly these (and
# reduces with numpy); compiled code is what tl.max / tl.sum / tl.cumsum emit.
_MAX = tl.standard._elementwise_max
_MIN = tl.standard._elementwise_min
_ADD = tl.standard._sum_combine

_LOW32 = 0xFFFFFFFF
_NO_CANDIDATE = -(2 ** 63)  # below every packed candidate (their low word is never 0)


# ----------------------------------------------------------------------------- kernels

@triton.jit
def _rows_topk_kernel(
    x_ptr, vals_ptr, idx_ptr, n_rows, N, stride_row,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, K: tl.constexpr, KPAD: tl.constexpr,
    IS_FLOAT: tl.constexpr, SOFTMAX: tl.constexpr, RENORM: tl.constexpr,
):
    """ROWS short rows per program: k rounds of max-and-knock-out on packed words; optional softmax."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    rows64 = rows.to(tl.int64)[:, None]
    cols = tl.arange(0, BLOCK_N)
    mask = row_ok[:, None] & (cols < N)[None, :]
    x = tl.load(x_ptr + rows64 * stride_row + cols[None, :], mask=mask, other=0,
                eviction_policy="evict_first")
    if SOFTMAX:  # row statistics first, so the tile of x is dead during the k rounds
        xf = tl.where(mask, x.to(tl.float32), float("-inf"))
        row_max = tl.reduce(xf, 1, _MAX, keep_dims=True)  # NaN-ignoring; a NaN still poisons the sum
        total = tl.reduce(tl.where(mask, tl.exp(xf - row_max), 0.0), 1, _ADD, keep_dims=True)
    key = order_key(x, IS_FLOAT)  # order-preserving int32 key; all NaNs on top, -0.0 folded onto +0.0
    # Each round: the row's largest key, the lowest column holding it, knock that column out
    # (all 32-bit, cheaper than a max over packed 64-bit words). Padding and knocked-out
    # columns hold INT32_MIN, which no key of a float, int8, uint8 or int16 can be (int32
    # inputs take the wide path), and k <= N keeps them from ever being picked.
    key = tl.where(mask, key, -2147483648)
    slot = tl.arange(0, KPAD)[None, :]
    idx = tl.full([ROWS, KPAD], 0, tl.int32)
    for i in tl.static_range(K):
        best = tl.reduce(key, 1, _MAX, keep_dims=True)
        col = tl.reduce(tl.where(key == best, cols[None, :], BLOCK_N), 1, _MIN, keep_dims=True)
        idx = tl.where(slot == i, col, idx)
        key = tl.where(cols[None, :] == col, -2147483648, key)
    out_ok = row_ok[:, None] & (slot < K)
    v = tl.load(x_ptr + rows64 * stride_row + idx, mask=out_ok, other=0)  # the elements, bit for bit
    if SOFTMAX:
        out = tl.exp(v.to(tl.float32) - row_max) / total
        if RENORM:
            out = out / tl.reduce(tl.where(slot < K, out, 0.0), 1, _ADD, keep_dims=True)
    else:
        out = v
    tl.store(vals_ptr + rows64 * K + slot, out.to(vals_ptr.dtype.element_ty), mask=out_ok)
    tl.store(idx_ptr + rows64 * K + slot, idx, mask=out_ok)


@triton.jit
def _chunk_candidates_kernel(
    x_ptr, ws_ptr, N, stride_row, k, ws_stride,
    CHUNK: tl.constexpr, GROUPS: tl.constexpr, CAP: tl.constexpr, DIGIT: tl.constexpr,
    SEARCH_BITS: tl.constexpr, IS_FLOAT: tl.constexpr,
):
    """Program (row, chunk): write a superset of the chunk's top k (at most CAP packed words) to ws."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    col = chunk * CHUNK + tl.arange(0, CHUNK)
    valid = col < N
    x = tl.load(x_ptr + row * stride_row + col, mask=valid, other=0, eviction_policy="evict_first")
    key = order_key(x, IS_FLOAT)  # order-preserving int32 key; all NaNs on top, -0.0 folded onto +0.0
    # the same order as unsigned numbers, so a bitwise search can build the threshold from the top bit;
    # padding gets 0, below any threshold the search can produce (those always have a bit set)
    ukey = tl.where(valid, key.to(tl.uint32, bitcast=True) ^ 0x80000000, 0)

    # Lower bound: maxima of GROUPS strided groups (group = column % GROUPS, so sorted or
    # clustered rows still spread their largest values over many groups). The k-th largest
    # maximum t has k distinct elements >= t, so the chunk's top k are all >= t.
    # The largest t with count(group_max >= t) >= k, DIGIT bits a round from the top: each
    # round counts against all 2^DIGIT trial digits at once, so it costs one block reduction.
    # Only the top SEARCH_BITS bits are searched: t only grows while k maxima still reach it,
    # so a shorter search is still a lower bound, just a little looser (16 bits: within
    # 1/128 relative for floats, exact for bf16).
    group_max = tl.reduce(tl.reshape(ukey, [CHUNK // GROUPS, GROUPS]), 0, _MAX)
    digits = tl.arange(0, 1 << DIGIT).to(tl.uint32)
    t = tl.full([], 0, tl.uint32)
    for rnd in range(SEARCH_BITS // DIGIT):
        shift = 32 - DIGIT * (rnd + 1)
        trials = t | (digits << shift)
        # groups on axis 0, trials on axis 1: Triton lays lanes along the last axis, so the
        # count over the groups stays mostly within each thread's registers
        counts = tl.reduce((group_max[:, None] >= trials[None, :]).to(tl.int32), 0, _ADD)
        # counts fall as the trial digit grows: the digit kept is how many trials reach k, less one
        t = t | ((tl.reduce((counts >= k).to(tl.int32), 0, _ADD) - 1).to(tl.uint32) << shift)
    # Common case: everything >= t fits the slots (ties at t included: harmless, all of them).
    take = valid & (ukey >= t)
    n_taken = tl.reduce(take.to(tl.int32), 0, _ADD)
    if n_taken > CAP:  # loose bound or a flood of ties: the chunk's exact k-th largest instead
        t = tl.full([], 0, tl.uint32)
        bit = tl.full([], 0x80000000, tl.uint32)
        for _ in range(32):
            trial = t | bit
            t = tl.where(tl.reduce((valid & (ukey >= trial)).to(tl.int32), 0, _ADD) >= k, trial, t)
            bit = bit >> 1
        # everything above t (fewer than k), then ties at t lowest column first, k in all
        above = valid & (ukey > t)
        n_above = tl.reduce(above.to(tl.int32), 0, _ADD)
        tie = (valid & (ukey == t)).to(tl.int32)
        tie_rank = tl.associative_scan(tie, 0, _ADD) - tie
        take = above | ((tie != 0) & (tie_rank < k - n_above))
        n_taken = tl.reduce(take.to(tl.int32), 0, _ADD)
    take_i = take.to(tl.int32)
    slot = tl.associative_scan(take_i, 0, _ADD) - 1  # column order is kept
    word = (key.to(tl.int64) << 32) | (col.to(tl.int64) ^ 0xFFFFFFFF)
    out = ws_ptr + row * ws_stride + chunk * CAP
    tl.store(out + slot, word, mask=take)
    free = tl.arange(0, CAP)
    tl.store(out + free, tl.full([CAP], -9223372036854775808, tl.int64), mask=free >= n_taken)


@triton.jit
def _merge_candidates_kernel(
    ws_ptr, x_ptr, vals_ptr, idx_ptr, out_ptr, stride_row, k, n_words, ws_stride, out_stride,
    M: tl.constexpr, LOGM: tl.constexpr, KPAD: tl.constexpr, LOGK: tl.constexpr,
    FINAL: tl.constexpr,
):
    """Program (row, g): bitonic top-KPAD of the row's candidate words [g*M, g*M + M).

    FINAL: gather the values and write the results (one program a row); otherwise write the
    KPAD best words to out_ptr[row, g*KPAD:], a level of the merge tree (large k only).

    The words live on a hypercube of shape [2]*LOGM; bit d of a position is the axis
    LOGM-1-d, so the partner at distance 2^d is the sum over that axis minus oneself
    (int64 addition wraps, the difference is exact), and one reduction does a pass.
    """
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * M + tl.arange(0, M)
    words = tl.load(ws_ptr + row * ws_stride + offs, mask=offs < n_words, other=-9223372036854775808)
    if LOGK == 0:
        top = tl.reduce(words, 0, _MAX, keep_dims=True)
    else:
        h = tl.reshape(words, [2] * LOGM)
        two = tl.arange(0, 2)
        # 1) sort runs of KPAD, alternating descending / ascending (bit LOGK of the position)
        for s in tl.static_range(1, LOGK + 1):
            if s < LOGM:
                desc = tl.reshape(two, [1] * (LOGM - 1 - s) + [2] + [1] * s) ^ 1
            else:
                desc = 1  # one run: the final order
            for i in tl.static_range(s):  # bit d = s - 1 - i lives on axis LOGM - s + i
                hi = tl.reshape(two, [1] * (LOGM - s + i) + [2] + [1] * (s - 1 - i))
                partner = tl.reduce(h, LOGM - s + i, _ADD, keep_dims=True) - h  # wraps, exactly
                h = tl.where((hi ^ desc) != 0, tl.maximum(h, partner), tl.minimum(h, partner))
        # 2) halve: a descending run against an ascending one, elementwise max, is a bitonic
        #    run holding the top KPAD of both; re-sort it (alternating again, until one is left)
        for r in tl.static_range(LOGM - LOGK):
            h = tl.reduce(h, LOGM - r - 1 - LOGK, _MAX)
            # LOGM - r - 1 bits are left
            if LOGM - r - 1 > LOGK:
                desc = tl.reshape(two, [1] * (LOGM - r - 2 - LOGK) + [2] + [1] * LOGK) ^ 1
            else:
                desc = 1
            for i in tl.static_range(LOGK):  # bit d = LOGK - 1 - i lives on axis LOGM - r - 1 - LOGK + i
                hi = tl.reshape(two, [1] * (LOGM - r - 1 - LOGK + i) + [2] + [1] * (LOGK - 1 - i))
                partner = tl.reduce(h, LOGM - r - 1 - LOGK + i, _ADD, keep_dims=True) - h  # wraps, exactly
                h = tl.where((hi ^ desc) != 0, tl.maximum(h, partner), tl.minimum(h, partner))
        top = tl.reshape(h, [KPAD])
    j = tl.arange(0, KPAD)
    if FINAL:
        ok = j < k
        idx = ((top & 0xFFFFFFFF) ^ 0xFFFFFFFF).to(tl.int32)
        v = tl.load(x_ptr + row * stride_row + idx, mask=ok, other=0)
        tl.store(vals_ptr + row * k + j, v, mask=ok)
        tl.store(idx_ptr + row * k + j, idx, mask=ok)
    else:
        tl.store(out_ptr + row * out_stride + tl.program_id(1) * KPAD + j, top)


# ----------------------------------------------------------------------------- launch

def _config(device: torch.device, overrides: dict | None) -> dict:
    cfg = dict(pick_config(CONFIGS, current_arch(device)))
    cfg.update(overrides or {})
    return cfg


def _rows_of(x: torch.Tensor, k: int) -> tuple[torch.Tensor, int]:
    """x as a [rows, N] view with unit column stride; checks k and the dtype."""
    if x.dim() == 0:
        raise ValueError("top_k needs at least one axis")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"top_k: unsupported dtype {x.dtype}; supported: {SUPPORTED_DTYPES}")
    N = x.shape[-1]
    if not (isinstance(k, int) and 1 <= k <= N):
        raise ValueError(f"top_k: k must be an int in [1, {N}], got {k!r}")
    x2 = x.reshape(-1, N)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    return x2, N


def _outputs(x: torch.Tensor, k: int, dtype: torch.dtype):
    shape = tuple(x.shape[:-1]) + (k,)
    return (torch.empty(shape, dtype=dtype, device=x.device),
            torch.empty(shape, dtype=torch.int32, device=x.device))


def _launch_rows(x2, vals, idx, k, cfg, softmax: bool, renorm: bool) -> None:
    rows, N = x2.shape
    block_n = next_pow2(N)
    per_program = max(1, min(cfg["narrow_tile"] // block_n, next_pow2(rows)))
    grid = (triton.cdiv(rows, per_program),)
    runner(_rows_topk_kernel, x2.device)[grid](
        x2, vals, idx, rows, N, x2.stride(0),
        ROWS=per_program, BLOCK_N=block_n, K=k, KPAD=next_pow2(k),
        IS_FLOAT=x2.dtype.is_floating_point, SOFTMAX=softmax, RENORM=renorm,
        num_warps=cfg["narrow_warps"],
    )


def wide_plan(N: int, k: int, cfg: dict) -> dict:
    """Chunk, group and candidate-slot sizes of the wide-row path (all powers of two)."""
    kpad = next_pow2(k)
    chunk = min(next_pow2(N), max(cfg["chunk"], cfg["chunk_per_kpad"] * kpad))
    # the bound lets through about k plus a few (k^2 / 2 groups collisions): 15% + 4 of slack
    cap = min(next_pow2(k + k // 7 + 4), chunk)
    group_size = max(1, min(cfg["group_size"], chunk // (4 * kpad)))
    groups = chunk // group_size
    n_chunks = triton.cdiv(N, chunk)
    m_valid = n_chunks * cap
    m = max(2, next_pow2(m_valid))
    threads = min(512, max(cfg["warp_size"], chunk // cfg["chunk_elems_per_thread"]))
    # digit search: 2^digit trial thresholds against every group maximum; keep that tile small
    digit = cfg["digit_bits"] if groups << cfg["digit_bits"] <= 32 * threads else 1
    search_bits = max(digit, cfg["search_bits"] // digit * digit)
    return {"kpad": kpad, "chunk": chunk, "cap": cap, "groups": groups, "digit": digit,
            "search_bits": search_bits,
            "n_chunks": n_chunks, "m_valid": m_valid, "m": m,
            "chunk_warps": threads // cfg["warp_size"],
            "merge_max": max(cfg["merge_max"], 4 * kpad)}


def _merge_warps(m: int, cfg: dict) -> int:
    return max(1, min(16, cfg["merge_warps"], m // 64))


def _launch_wide(x2, vals, idx, k, cfg) -> None:
    rows, N = x2.shape
    plan = wide_plan(N, k, cfg)
    ws = torch.empty((rows, plan["m_valid"]), dtype=torch.int64, device=x2.device)
    runner(_chunk_candidates_kernel, x2.device)[(rows, plan["n_chunks"])](
        x2, ws, N, x2.stride(0), k, plan["m_valid"],
        CHUNK=plan["chunk"], GROUPS=plan["groups"], CAP=plan["cap"], DIGIT=plan["digit"],
        SEARCH_BITS=plan["search_bits"], IS_FLOAT=x2.dtype.is_floating_point, num_warps=plan["chunk_warps"],
    )
    kpad, n_words, segment = plan["kpad"], plan["m_valid"], plan["cap"]
    merge = runner(_merge_candidates_kernel, x2.device)
    while n_words > plan["merge_max"]:  # a tree level: groups of segments down to KPAD words each
        m = plan["merge_max"] // segment * segment
        groups = triton.cdiv(n_words, m)
        out = torch.empty((rows, groups * kpad), dtype=torch.int64, device=x2.device)
        merge[(rows, groups)](
            ws, x2, vals, idx, out, x2.stride(0), k, n_words, ws.stride(0), out.stride(0),
            M=m, LOGM=m.bit_length() - 1, KPAD=kpad, LOGK=kpad.bit_length() - 1, FINAL=False,
            num_warps=_merge_warps(m, cfg),
        )
        ws, n_words, segment = out, groups * kpad, kpad
    m = max(2, next_pow2(n_words))
    merge[(rows, 1)](
        ws, x2, vals, idx, ws, x2.stride(0), k, n_words, ws.stride(0), 0,
        M=m, LOGM=m.bit_length() - 1, KPAD=kpad, LOGK=kpad.bit_length() - 1, FINAL=True,
        num_warps=_merge_warps(m, cfg),
    )


def top_k(x: torch.Tensor, k: int, *, config: dict | None = None):
    """(values, indices) of the k largest entries along the last axis; see the module docstring.

    ``config`` overrides entries of this arch's CONFIGS (tests use it to force small chunks).
    """
    x2, N = _rows_of(x, k)
    vals, idx = _outputs(x, k, x.dtype)
    if x2.shape[0] == 0:
        return vals, idx
    cfg = _config(x.device, config)
    if N <= cfg["narrow_max_n"] and k <= cfg["narrow_max_k"] and x.dtype != torch.int32:
        _launch_rows(x2, vals, idx, k, cfg, softmax=False, renorm=False)
    else:
        _launch_wide(x2, vals, idx, k, cfg)
    return vals, idx


def softmax_top_k(logits: torch.Tensor, k: int, renormalize: bool = False, *, config: dict | None = None):
    """(probs, indices): softmax over the last axis (fp32 inside), then its top k, in one kernel.

    Rows up to ``narrow_max_n`` long and k up to ``narrow_max_k`` (MoE routers). With
    ``renormalize`` the k probabilities are divided by their sum. Probs have the logits' dtype.
    """
    x2, N = _rows_of(logits, k)
    if not logits.dtype.is_floating_point:
        raise TypeError("softmax_top_k needs floating-point logits")
    cfg = _config(logits.device, config)
    if N > cfg["narrow_max_n"] or k > cfg["narrow_max_k"]:
        raise ValueError(f"softmax_top_k: rows up to {cfg['narrow_max_n']} and k up to "
                         f"{cfg['narrow_max_k']} (got N={N}, k={k}); use softmax then top_k")
    probs, idx = _outputs(logits, k, logits.dtype)
    if x2.shape[0]:
        _launch_rows(x2, probs, idx, k, cfg, softmax=True, renorm=bool(renormalize))
    return probs, idx


# ----------------------------------------------------------------------------- reference

def reference_top_k(x: torch.Tensor, k: int):
    """The oracle: a stable lexicographic sort in float64 with exactly the rules above."""
    N = x.shape[-1]
    rows = x.detach().reshape(-1, N)
    v = rows.to(torch.float64).cpu().numpy()
    nan = np.isnan(v)
    value = np.where(nan, 0.0, v) + 0.0  # + 0.0 turns -0.0 into +0.0
    col = np.broadcast_to(np.arange(N), v.shape)
    # np.lexsort sorts by its last key first: NaN first, then larger value, then lower column
    order = np.lexsort((col, -value, -nan.astype(np.int8)), axis=-1)[:, :k]
    indices = torch.from_dlpack(np.ascontiguousarray(order)).to(torch.int64).to(x.device)
    values = torch.gather(rows, 1, indices)
    shape = tuple(x.shape[:-1]) + (k,)
    return values.reshape(shape), indices.to(torch.int32).reshape(shape)


def reference_softmax_top_k(logits: torch.Tensor, k: int, renormalize: bool = False):
    """float64 probabilities at the reference top-k indices of the logits."""
    _, indices = reference_top_k(logits, k)
    probs = torch.softmax(logits.detach().to(torch.float64), dim=-1)
    picked = torch.gather(probs, -1, indices.to(torch.int64))
    if renormalize:
        picked = picked / picked.sum(-1, keepdim=True)
    return picked, indices


# ----------------------------------------------------------------------------- compile specs

def compile_specs() -> list:
    """The sizes that matter: MoE router (256 experts, top 8) and a 131072 vocabulary, k=50 and
    k=1024. Wide-row specs follow each arch's plan (warps differ with the wave size), so their
    names end in the arch they are meant for."""
    specs = []
    for arch in ("sm_90", "gfx950"):
        cfg = CONFIGS[arch]
        specs.append(KernelSpec(
            f"top_k_rows_softmax_fp32_n256_k8_{arch}", _rows_topk_kernel,
            {"x_ptr": "*fp32", "vals_ptr": "*fp32", "idx_ptr": "*i32", "n_rows": "i32", "N": "i32",
             "stride_row": "i32", "ROWS": "constexpr", "BLOCK_N": "constexpr", "K": "constexpr",
             "KPAD": "constexpr", "IS_FLOAT": "constexpr", "SOFTMAX": "constexpr", "RENORM": "constexpr"},
            {"ROWS": cfg["narrow_tile"] // 256, "BLOCK_N": 256, "K": 8, "KPAD": 8,
             "IS_FLOAT": True, "SOFTMAX": True, "RENORM": True},
            num_warps=cfg["narrow_warps"],
        ))
        for k in (50, 1024):
            plan = wide_plan(131072, k, cfg)
            specs.append(KernelSpec(
                f"top_k_chunk_bf16_k{k}_{arch}", _chunk_candidates_kernel,
                {"x_ptr": "*bf16", "ws_ptr": "*i64", "N": "i32", "stride_row": "i32", "k": "i32",
                 "ws_stride": "i32", "CHUNK": "constexpr", "GROUPS": "constexpr", "CAP": "constexpr",
                 "DIGIT": "constexpr", "SEARCH_BITS": "constexpr", "IS_FLOAT": "constexpr"},
                {"CHUNK": plan["chunk"], "GROUPS": plan["groups"], "CAP": plan["cap"],
                 "DIGIT": plan["digit"], "SEARCH_BITS": plan["search_bits"], "IS_FLOAT": True},
                num_warps=plan["chunk_warps"],
            ))
            m = min(plan["m"], plan["merge_max"])  # the final merge (k=50), or a tree level (k=1024)
            specs.append(KernelSpec(
                f"top_k_merge_fp32_k{k}_m{m}_{arch}", _merge_candidates_kernel,
                {"ws_ptr": "*i64", "x_ptr": "*fp32", "vals_ptr": "*fp32", "idx_ptr": "*i32",
                 "out_ptr": "*i64", "stride_row": "i32", "k": "i32", "n_words": "i32", "ws_stride": "i32",
                 "out_stride": "i32", "M": "constexpr", "LOGM": "constexpr", "KPAD": "constexpr",
                 "LOGK": "constexpr", "FINAL": "constexpr"},
                {"M": m, "LOGM": m.bit_length() - 1, "KPAD": plan["kpad"],
                 "LOGK": plan["kpad"].bit_length() - 1, "FINAL": plan["m"] <= plan["merge_max"]},
                num_warps=_merge_warps(m, cfg),
            ))
    return specs
