"""Matrix decompositions and solvers as lazy library nodes that call torch.linalg (as JAX calls cuSOLVER /
LAPACK): cholesky, qr, svd, svdvals, eigh, eigvalsh, eig, eigvals, inv, solve, det, slogdet, pinv, matrix_rank.
They take float32/float64 and complex64/complex128 matrices (complex buffers go to torch as they are; values
that are real by definition, singular values and Hermitian eigenvalues, come back real).

These are not our kernels: the gpu backend runs torch.linalg on the device (cuSOLVER / rocSOLVER), the CPU
backends run it on the CPU. They are graph nodes like any library op (lazy, batched over leading axes,
vmap-able); they have no derivative rules yet (fa.grad through them raises). matrix_power is matmuls.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import dtypes as dt
from .. import views
from .checks import check_bool
from .library import Library, call

_FLOATS = (dt.float32, dt.float64, dt.complex64, dt.complex128)


def _square(op, x):
    if len(x.shape) < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"{op}: x must be a stack of square matrices (..., n, n), got shape {x.shape}")


def _float(op, x):
    if x.dtype not in _FLOATS:
        raise TypeError(f"{op}: x has dtype {x.dtype}; torch.linalg takes float32, float64, complex64 or complex128 "
                        "(cast with astype)")


def _matrix(op, x):
    _float(op, x)
    if len(x.shape) < 2:
        raise ValueError(f"{op}: x must have at least 2 dimensions, got shape {x.shape}")


def _array_arg(x, where):
    from .core import array_arg
    return array_arg(x, where)


def _op(name, abstract, fn):
    """A library primitive whose kernel and reference are both ``fn`` (torch.linalg, on the array's device)."""
    return Library(name, abstract, fn, fn)


def _same(op, square=True):
    def abstract(x, **kw):
        _matrix(op, x)
        if square:
            _square(op, x)
        return [(x.shape, x.dtype)]
    return abstract


def _scalar(op):
    def abstract(x, **kw):
        _matrix(op, x)
        _square(op, x)
        return [(x.shape[:-2], x.dtype)]
    return abstract


CHOLESKY = _op("cholesky", _same("cholesky"), lambda x, *, upper: torch.linalg.cholesky(x, upper=upper))
INV = _op("inv", _same("inv"), lambda x: torch.linalg.inv(x))
DET = _op("det", _scalar("det"), lambda x: torch.linalg.det(x))


def _slogdet_abstract(x):
    _scalar("slogdet")(x)
    return [(x.shape[:-2], x.dtype), (x.shape[:-2], dt.real_dtype(x.dtype))]  # (sign, log|det|)


SLOGDET = _op("slogdet", _slogdet_abstract, lambda x: tuple(torch.linalg.slogdet(x)))


def _qr_abstract(x, *, mode):
    _matrix("qr", x)
    if mode not in ("reduced", "complete"):
        raise ValueError(f"qr: mode must be 'reduced' or 'complete', got {mode!r}")
    *b, m, n = x.shape
    k = min(m, n) if mode == "reduced" else m
    return [(tuple(b) + (m, k), x.dtype), (tuple(b) + (k, n), x.dtype)]


QR = _op("qr", _qr_abstract, lambda x, *, mode: tuple(torch.linalg.qr(x, mode=mode)))


def _svd_abstract(x, *, full_matrices):
    _matrix("svd", x)
    *b, m, n = x.shape
    k = min(m, n)
    b = tuple(b)
    u, v = (m, n) if full_matrices else (k, k)
    return [(b + (m, u), x.dtype), (b + (k,), dt.real_dtype(x.dtype)), (b + (v, n), x.dtype)]


SVD = _op("svd", _svd_abstract, lambda x, *, full_matrices: tuple(torch.linalg.svd(x, full_matrices=full_matrices)))


def _svdvals_abstract(x):
    _matrix("svdvals", x)
    return [(x.shape[:-2] + (min(x.shape[-2:]),), dt.real_dtype(x.dtype))]


SVDVALS = _op("svdvals", _svdvals_abstract, lambda x: torch.linalg.svdvals(x))


def _eigh_abstract(x, op="eigh"):
    _matrix(op, x)
    _square(op, x)
    return [(x.shape[:-1], dt.real_dtype(x.dtype)), (x.shape, x.dtype)]


EIGH = _op("eigh", _eigh_abstract, lambda x: tuple(torch.linalg.eigh(x)))
EIGVALSH = _op("eigvalsh", lambda x: _eigh_abstract(x, "eigvalsh")[:1], lambda x: torch.linalg.eigvalsh(x))


def _eig_abstract(x, op="eig"):
    _matrix(op, x)
    _square(op, x)
    c = dt.complex_dtype(dt.real_dtype(x.dtype))
    return [(x.shape[:-1], c), (x.shape, c)]


EIG = _op("eig", _eig_abstract, lambda x: tuple(torch.linalg.eig(x)))
EIGVALS = _op("eigvals", lambda x: _eig_abstract(x, "eigvals")[:1], lambda x: torch.linalg.eigvals(x))


def _solve_abstract(a, b):
    _matrix("solve", a)
    _square("solve", a)
    if b.dtype not in _FLOATS:
        raise TypeError(f"solve: x2 has dtype {b.dtype}; torch.linalg takes float32, float64, complex64 or "
                        "complex128 (cast with astype)")
    if a.dtype != b.dtype:  # solve() promotes first: this is a direct call(SOLVE, ...)
        raise TypeError(f"solve: x1 and x2 have dtypes {a.dtype} and {b.dtype}; cast one with astype")
    n = a.shape[-1]
    if not b.shape:
        raise ValueError("solve: x2 must be a vector (M,) or a stack of matrices (..., M, K), got shape ()")
    if len(b.shape) == 1:
        if b.shape[0] != n:
            raise ValueError(f"solve: x1 {a.shape} and the vector x2 {b.shape} differ in size")
        return [(a.shape[:-1], a.dtype)]
    if b.shape[-2] != n:
        raise ValueError(f"solve: x1 {a.shape} and x2 {b.shape}: x2's rows must be {n}")
    batch = views.broadcast_batch("solve", (a.shape, b.shape))
    return [(batch + b.shape[-2:], a.dtype)]


def _solve(a, b):
    if b.dim() == 1:  # the array API's vector right-hand side
        return torch.linalg.solve(a, b.expand(a.shape[:-1]).unsqueeze(-1)).squeeze(-1)
    return torch.linalg.solve(a, b)


SOLVE = _op("solve", _solve_abstract, _solve)


def _pinv_abstract(x, *, rtol):
    _matrix("pinv", x)
    return [(x.shape[:-2] + (x.shape[-1], x.shape[-2]), x.dtype)]


PINV = _op("pinv", _pinv_abstract, lambda x, *, rtol: torch.linalg.pinv(x, rtol=rtol))


def _rank_abstract(x, *, rtol):
    _matrix("matrix_rank", x)
    return [(x.shape[:-2], dt.int64)]


RANK = _op("matrix_rank", _rank_abstract, lambda x, *, rtol: torch.linalg.matrix_rank(x, rtol=rtol))


def _array_rtol_abstract(op, result):
    """pinv / matrix_rank with an array ``rtol`` (the standard allows one per matrix, broadcast against the
    stack x[..., 0, 0]): a second input, since an array cannot be a node's parameter."""
    def abstract(x, rtol):
        _matrix(op, x)
        if rtol.dtype.kind != "f":
            raise TypeError(f"{op}: an array rtol must be real floating point, got {rtol.dtype}")
        try:
            batch = views.broadcast_shapes(x.shape[:-2], rtol.shape)
        except ValueError:
            raise ValueError(f"{op}: rtol's shape {rtol.shape} does not broadcast against the stack of matrices "
                             f"{x.shape[:-2]} (x has shape {x.shape})") from None
        return [result(x, batch)]
    return abstract


def _with_array_rtol(fn):
    """torch's ``fn(x, rtol=tensor)`` with x and rtol broadcast to one stack first (torch would resize its
    output where rtol's stack is the larger, which it deprecates)."""
    def run(x, rtol):
        batch = torch.broadcast_shapes(x.shape[:-2], rtol.shape)
        return fn(x.expand(batch + x.shape[-2:]), rtol=rtol.to(x.real.dtype).expand(batch))
    return run


PINV_ARRAY_RTOL = _op("pinv", _array_rtol_abstract("pinv", lambda x, b: (b + (x.shape[-1], x.shape[-2]), x.dtype)),
                      _with_array_rtol(torch.linalg.pinv))
RANK_ARRAY_RTOL = _op("matrix_rank", _array_rtol_abstract("matrix_rank", lambda x, b: (b, dt.int64)),
                      _with_array_rtol(torch.linalg.matrix_rank))


def _rtol(op, rtol, x):
    """None, a float (a parameter: Python, numpy and 0-d numpy/torch scalars), or an Array input (an fa.Array
    as it is; a numpy array or torch tensor with dimensions taken onto x's device)."""
    import numpy as np
    from .._array import Array
    if rtol is None or isinstance(rtol, Array):
        return rtol
    if isinstance(rtol, (np.ndarray, torch.Tensor)) and rtol.ndim:
        from .creation import asarray
        return asarray(rtol, device=x.device)
    try:
        return float(rtol)
    except (TypeError, ValueError):
        raise TypeError(f"{op}: rtol must be None, a real number or a real floating-point array, "
                        f"got {type(rtol).__name__}") from None

DECOMPOSITIONS = (CHOLESKY, INV, DET, SLOGDET, QR, SVD, SVDVALS, EIGH, EIGVALSH, EIG, EIGVALS, SOLVE, PINV, RANK,
                  PINV_ARRAY_RTOL, RANK_ARRAY_RTOL)


def cholesky(x, /, *, upper=False):
    """The Cholesky factor L (x = L L^H) of Hermitian positive-definite matrices (U with ``upper``);
    float32/64 or complex64/128.
    A lazy library call to torch.linalg.cholesky."""
    return call(CHOLESKY, [x], upper=check_bool("cholesky", "upper", upper))[0]


class QRResult(NamedTuple):
    Q: object
    R: object


class SVDResult(NamedTuple):
    U: object
    S: object
    Vh: object


class EighResult(NamedTuple):
    eigenvalues: object
    eigenvectors: object


class EigResult(NamedTuple):
    eigenvalues: object
    eigenvectors: object


class SlogdetResult(NamedTuple):
    sign: object
    logabsdet: object


def qr(x, /, *, mode="reduced"):
    """(Q, R) (a named tuple, as the array API's) with x = Q R, ``mode`` 'reduced' or 'complete'; float32/64 or complex64/128. A lazy call to
    torch.linalg.qr."""
    return QRResult(*call(QR, [x], mode=mode))


def svd(x, /, *, full_matrices=True):
    """(U, S, Vh) with x = U diag(S) Vh, S descending (real); float32/64 or complex64/128. A lazy call to
    torch.linalg.svd."""
    return SVDResult(*call(SVD, [x], full_matrices=check_bool("svd", "full_matrices", full_matrices)))


def svdvals(x, /):
    """The singular values of the last two axes, descending (real); float32/64 or complex64/128. A lazy call
    to torch.linalg.svdvals."""
    return call(SVDVALS, [x])[0]


def eigh(x, /):
    """(eigenvalues ascending, eigenvectors) of symmetric / Hermitian matrices (the lower triangle is read; the
    eigenvalues are real); float32/64 or complex64/128.
    A lazy call to torch.linalg.eigh."""
    return EighResult(*call(EIGH, [x]))


def eigvalsh(x, /):
    """The eigenvalues of symmetric / Hermitian matrices, ascending (real); float32/64 or complex64/128. A lazy
    call to torch.linalg.eigvalsh."""
    return call(EIGVALSH, [x])[0]


def eig(x, /):
    """(eigenvalues, eigenvectors) of general square matrices, both complex (complex64 for float32/complex64
    input, complex128 for float64/complex128), unordered; columns of the eigenvectors have unit norm.
    A lazy call to torch.linalg.eig."""
    return EigResult(*call(EIG, [x]))


def eigvals(x, /):
    """The eigenvalues of general square matrices, complex, unordered. A lazy call to torch.linalg.eigvals."""
    return call(EIGVALS, [x])[0]


def inv(x, /):
    """The inverse of square matrices; float32/64 or complex64/128. A lazy call to torch.linalg.inv (singular
    input: torch's error, at evaluation)."""
    return call(INV, [x])[0]


def solve(x1, x2, /):
    """The solution X of x1 X = x2 (x2 a stack of matrices whose batch dims broadcast with x1's, or one vector:
    the array API's reading, where torch would take x2 of shape x1.shape[:-1] as a stack of vectors);
    float32/64 or complex64/128. A lazy call to torch.linalg.solve."""
    x1, x2 = _array_arg(x1, "solve: x1"), _array_arg(x2, "solve: x2")
    if x1.dtype != x2.dtype and x1.dtype in _FLOATS and x2.dtype in _FLOATS:  # the array API's promotion
        d = dt.promote(x1.dtype, x2.dtype)
        x1, x2 = x1.astype(d, copy=False), x2.astype(d, copy=False)
    if 2 <= x2.ndim < x1.ndim:  # torch would read x2 of shape x1.shape[:-1] as a stack of vectors
        if x1.ndim >= 2 and x2.shape[-2] != x1.shape[-1]:   # (named with the shapes given, before broadcasting)
            raise ValueError(f"solve: x1 {x1.shape} and x2 {x2.shape}: x2's rows must be {x1.shape[-1]}")
        x2 = _broadcast_batch(x2, x1.shape, "solve")
    return call(SOLVE, [x1, x2])[0]


def _broadcast_batch(x, x1_shape, where):
    """A stack of matrices ``x`` (the x2 of ``where``) broadcast to the batch dims it shares with x1's (so torch,
    which tells a stack of vectors from a stack of matrices by the number of dims, reads it as matrices)."""
    full = views.broadcast_batch(where, (x1_shape, x.shape))
    from .manipulation import broadcast_to
    return broadcast_to(x, full + tuple(x.shape[-2:]))


def det(x, /):
    """The determinant of square matrices; float32/64 or complex64/128. A lazy call to torch.linalg.det."""
    return call(DET, [x])[0]


def slogdet(x, /):
    """(sign, log|det|) of square matrices; float32/64 or complex64/128. A lazy call to torch.linalg.slogdet."""
    return SlogdetResult(*call(SLOGDET, [x]))


def pinv(x, /, *, rtol=None):
    """The Moore-Penrose pseudo-inverse (singular values below ``rtol`` times the largest are dropped);
    float32/64 or complex64/128. A lazy call to torch.linalg.pinv."""
    x = _array_arg(x, "pinv: x")
    rtol = _rtol("pinv", rtol, x)
    if rtol is not None and not isinstance(rtol, float):
        return call(PINV_ARRAY_RTOL, [x, rtol])[0]
    return call(PINV, [x], rtol=rtol)[0]


def matrix_rank(x, /, *, rtol=None):
    """The rank (singular values above ``rtol`` times the largest), int64; float32/64 or complex64/128 input.
    A lazy call to torch.linalg.matrix_rank."""
    x = _array_arg(x, "matrix_rank: x")
    rtol = _rtol("matrix_rank", rtol, x)
    if rtol is not None and not isinstance(rtol, float):
        return call(RANK_ARRAY_RTOL, [x, rtol])[0]
    return call(RANK, [x], rtol=rtol)[0]


def matrix_power(x, n, /):
    """x to the integer power ``n`` (n < 0: of its inverse) by repeated squaring with matmul; n == 0 gives
    identity matrices. Float dtypes."""
    from .creation import eye
    from .linalg import matmul
    from .manipulation import broadcast_to
    n = views.as_int(n, "matrix_power: n")
    _square("matrix_power", x)
    if n < 0:
        x, n = inv(x), -n
    result = None
    while n:
        if n & 1:
            result = x if result is None else matmul(result, x)
        n >>= 1
        if n:
            x = matmul(x, x)
    if result is None:
        return broadcast_to(eye(x.shape[-1], dtype=x.dtype, device=x.device), x.shape)
    return result
