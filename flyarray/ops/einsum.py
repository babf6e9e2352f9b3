"""fa.einsum: Einstein summation on views, elementwise ops, reductions and matmul.

Two float operands run as one (batched) matmul, as a hand-written tensordot would; anything else is a
broadcast product summed over the contracted letters, which the scheduler fuses into one reduction kernel.
A letter repeated inside one operand (``'ii->i'``) takes a diagonal by masking with an iota comparison.
"""
from __future__ import annotations

import math

from .. import dtypes as dt
from .._array import Array
from .core import node_of, operands_as_arrays


def einsum(subscripts, /, *operands) -> Array:
    """Einstein summation, numpy's notation: ``einsum('ij,jk->ik', a, b)``; the implicit form (no '->')
    sums letters that appear twice and orders the rest alphabetically. ``...`` stands for the axes a term
    does not name (broadcast across operands, right-aligned, as numpy's; first in an implicit output).
    Operand dtypes promote; float pairs contract with one matmul, the rest with a fused multiply-and-sum."""
    if not isinstance(subscripts, str):
        raise TypeError(f"einsum: subscripts must be a string, got {type(subscripts).__name__}")
    operands = operands_as_arrays(operands)
    subscripts = _named_ellipsis(subscripts.replace(" ", ""), operands)
    ins, out = _parse(subscripts, len(operands))
    sizes = {}
    for term, x in zip(ins, operands):
        if len(term) != len(node_of(x).shape):
            raise ValueError(f"einsum: operand {term!r} has {len(term)} letters but shape {x.shape}")
        for c, n in zip(term, x.shape):
            if c in sizes and n != sizes[c] and 1 not in (n, sizes[c]):
                raise ValueError(f"einsum: letter {c!r} has sizes {sizes[c]} and {n}")
            sizes[c] = n if sizes.get(c, 1) == 1 else sizes[c]   # a size 1 broadcasts (to 0 too)
    d = dt.result_type(*[x.dtype for x in operands])
    ops = [_distinct(term, x.astype(d, copy=False), sizes) for term, x in zip(ins, operands)]
    ops = [_sum_private(t, x, [o for j, o in enumerate(ops) if o is not ops[i]], out)
           for i, (t, x) in enumerate(ops)]
    if len(ops) == 2 and d.kind == "f":
        return _matmul_pair(ops[0], ops[1], out, sizes)
    return _product_sum(ops, out).astype(d, copy=False)


def _named_ellipsis(s, operands) -> str:
    """``s`` with every ``...`` replaced by letters it does not use: the broadcast axes, right-aligned
    across the terms (a term with fewer of them takes the last ones)."""
    if "." not in s:
        return s
    lhs, arrow, out = s.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise ValueError(f"einsum: {len(terms)} operand terms in {s!r} but {len(operands)} operands")
    counts = []
    for term, x in zip(terms, operands):
        named = term.replace("...", "", 1)
        if "." in named:
            raise ValueError(f"einsum: {term!r}: '.' only as one '...' per term")
        n = len(node_of(x).shape) - len(named) if "..." in term else 0
        if n < 0:
            raise ValueError(f"einsum: operand {term!r} names {len(named)} axes but has shape {tuple(x.shape)}")
        counts.append(n)
    width = max(counts)
    spare = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" if c not in s][:width]
    if len(spare) < width:
        raise ValueError(f"einsum: {s!r} leaves too few unused letters for its '...' axes")
    terms = [t.replace("...", "".join(spare[width - n:])) for t, n in zip(terms, counts)]
    if not arrow:  # numpy: the broadcast axes first, then the letters that appear once, in order
        letters = "".join(t for t in terms)
        once = sorted(c for c in set(letters) - set(spare) if letters.count(c) == 1)
        return ",".join(terms) + "->" + "".join(spare) + "".join(once)
    if "." in out.replace("...", "", 1):
        raise ValueError(f"einsum: output {out!r}: '.' only as one '...'")
    if "..." not in out and width:
        raise ValueError(f"einsum: {s!r} has '...' axes in its operands but none in its output; name them "
                         "or add '...' to the output")
    return ",".join(terms) + "->" + out.replace("...", "".join(spare))


def _parse(s, count):
    lhs, arrow, out = s.partition("->")
    ins = lhs.split(",")
    if len(ins) != count:
        raise ValueError(f"einsum: {len(ins)} operand terms in {s!r} but {count} operands")
    for t in ins + [out]:
        if not all(c.isalpha() for c in t):
            raise ValueError(f"einsum: subscripts must be letters, got {t!r}")
    if not arrow:
        counts = {c: sum(t.count(c) for t in ins) for c in set(lhs) - {","}}
        out = "".join(sorted(c for c, k in counts.items() if k == 1))
    if len(set(out)) != len(out) or not set(out) <= set(lhs):
        raise ValueError(f"einsum: output {out!r} must name distinct letters of the inputs")
    return ins, out


def _distinct(term, x, sizes):
    """(term, x) with no letter repeated: a repeated letter's extra axis is masked to the diagonal and
    summed away."""
    from .core import where
    from .creation import arange
    from .manipulation import reshape
    from .reductions import sum as _sum
    while len(set(term)) != len(term):
        c = next(c for c in term if term.count(c) > 1)
        i, j = term.index(c), term.index(c, term.index(c) + 1)
        n = x.shape[i]
        if x.shape[j] != n:
            raise ValueError(f"einsum: repeated letter {c!r} has sizes {n} and {x.shape[j]} in one operand")
        ai = reshape(arange(n, device=x.device), tuple(n if k == i else 1 for k in range(x.ndim)))
        aj = reshape(arange(n, device=x.device), tuple(n if k == j else 1 for k in range(x.ndim)))
        x = _sum(where(ai == aj, x, 0).astype(x.dtype, copy=False), axis=j).astype(x.dtype, copy=False)
        term = term[:j] + term[j + 1:]
    return term, x


def _sum_private(term, x, others, out):
    """Letters no other operand and not the output name are summed first (smaller operands)."""
    from .reductions import sum as _sum
    used = set(out).union(*[set(t) for t, _ in others])
    axes = tuple(i for i, c in enumerate(term) if c not in used)
    if not axes:
        return term, x
    return "".join(c for c in term if c in used), _sum(x, axis=axes).astype(x.dtype, copy=False)


def _align(term, x, order):
    """x with its axes permuted and padded to ``order`` (size 1 for letters it lacks)."""
    from .manipulation import permute_dims, reshape
    present = [c for c in order if c in term]
    x = permute_dims(x, tuple(term.index(c) for c in present))
    return reshape(x, tuple(x.shape[present.index(c)] if c in term else 1 for c in order))


def _product_sum(ops, out):
    from .reductions import sum as _sum
    letters = list(out) + sorted(set("".join(t for t, _ in ops)) - set(out))
    prod = None
    for term, x in ops:
        a = _align(term, x, letters)
        prod = a if prod is None else prod * a
    axes = tuple(range(len(out), len(letters)))
    return _sum(prod, axis=axes).astype(prod.dtype, copy=False) if axes else prod


def _matmul_pair(a_op, b_op, out, sizes):
    """Letters split into batch (both and out), contracted (both, not out), and each side's free ones:
    (batch, free_a, k) @ (batch, k, free_b), then reshaped and permuted to ``out``."""
    from .linalg import contract
    from .manipulation import broadcast_to, permute_dims, reshape
    (ta, a), (tb, b) = a_op, b_op
    batch = [c for c in out if c in ta and c in tb]
    red = [c for c in ta if c in tb and c not in out]
    fa_, fb = [c for c in ta if c not in tb], [c for c in tb if c not in ta]
    dims = {c: sizes[c] for c in batch + red + fa_ + fb}
    a = broadcast_to(_align(ta, a, batch + fa_ + red), tuple(dims[c] if c in ta else 1 for c in batch + fa_ + red))
    b = broadcast_to(_align(tb, b, batch + red + fb), tuple(dims[c] if c in tb else 1 for c in batch + red + fb))
    a = broadcast_to(a, tuple(dims[c] for c in batch) + a.shape[len(batch):])
    b = broadcast_to(b, tuple(dims[c] for c in batch) + b.shape[len(batch):])
    nb = math.prod(dims[c] for c in batch)
    k = math.prod(dims[c] for c in red)
    r = contract(reshape(a, (nb, math.prod(dims[c] for c in fa_), k)),
                 reshape(b, (nb, k, math.prod(dims[c] for c in fb))))
    got = batch + fa_ + fb
    r = reshape(r, tuple(dims[c] for c in got))
    return permute_dims(r, tuple(got.index(c) for c in out)) if got != list(out) else r
