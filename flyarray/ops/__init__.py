"""The public functional API, written on primitives (primitives.py) and library ops (library.py)."""
from .core import astype, where  # noqa: F401
from .creation import (arange, asarray, empty, empty_like, eye, from_dlpack, full, full_like, linspace,  # noqa: F401
                       ones, ones_like, zeros, zeros_like)
from .elementwise import *  # noqa: F401,F403
from .elementwise import clip, conj, gelu, isclose, real, relu, silu  # noqa: F401
from .indexing import nonzero, take, take_along_axis  # noqa: F401
from .library_ops import ragged_dot, top_k  # noqa: F401
from .einsum import einsum  # noqa: F401
from .linalg import cross, diagonal, matmul, matrix_norm, outer, tensordot, trace, vecdot, vector_norm  # noqa: F401
from .manipulation import (broadcast_arrays, broadcast_to, concat, diff, expand_dims, flip, getitem,  # noqa: F401
                           matrix_transpose, meshgrid, moveaxis, pad, permute_dims, repeat, reshape, roll, squeeze,
                           stack, tile, tril, triu, unstack)
from .reductions import all, any, count_nonzero, argmax, argmin, max, mean, min, prod, std, sum, var  # noqa: F401
from . import nn  # noqa: F401
