"""``fa.linalg``: the array API's linear algebra extension.

Built on lazy primitives (they fuse): matmul, matrix_transpose, vecdot, tensordot, outer, diagonal, trace,
cross, vector_norm, matrix_norm, matrix_power. Lazy library calls to torch.linalg (not our kernels; see
ops/decompositions.py): cholesky, qr, svd, svdvals, eigh, eigvalsh, eig, eigvals, inv, solve, det, slogdet, pinv,
matrix_rank.
"""
from .ops.decompositions import (cholesky, det, eig, eigh, eigvals, eigvalsh, inv, matrix_power,  # noqa: F401
                                 matrix_rank, pinv, qr, slogdet, solve, svd, svdvals)
from .ops.linalg import cross, diagonal, matmul, matrix_norm, outer, tensordot, trace, vecdot, vector_norm  # noqa: F401
from .ops.manipulation import matrix_transpose  # noqa: F401

__all__ = ["cholesky", "cross", "det", "diagonal", "eig", "eigh", "eigvals", "eigvalsh", "inv", "matmul", "matrix_norm",
           "matrix_power", "matrix_rank", "matrix_transpose", "outer", "pinv", "qr", "slogdet", "solve", "svd",
           "svdvals", "tensordot", "trace", "vecdot", "vector_norm"]


def _wrap():
    from .ops import _accepting_foreign
    for name in __all__:
        globals()[name] = _accepting_foreign(globals()[name])


_wrap()
