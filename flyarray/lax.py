"""fa.lax: structured control flow (cond, switch, fori_loop, while_loop, scan, map: flyarray/control_flow.py),
dynamic slicing (dynamic_slice, dynamic_update_slice and their _in_dim forms: flyarray/dynamic_slicing.py)
and collectives over named mesh axes, for use inside fa.shard_map (JAX's jax.lax names).

Each collective records one lazy collective node (flyarray/collectives.py) over the mesh of the enclosing
shard_map; ``axis_name`` is one mesh axis name or a tuple of them.
"""
from __future__ import annotations

from . import collectives as C
from .control_flow import cond, fori_loop, map, scan, select, switch, while_loop  # noqa: F401
from .transforms.autodiff import stop_gradient  # noqa: F401
from .dynamic_slicing import (dynamic_index_in_dim, dynamic_slice, dynamic_slice_in_dim,  # noqa: F401
                              dynamic_update_index_in_dim, dynamic_update_slice, dynamic_update_slice_in_dim)
from .shard_map import current_mesh

__all__ = ["cond", "switch", "select", "fori_loop", "while_loop", "scan", "map", "stop_gradient",
           "dynamic_slice", "dynamic_update_slice", "dynamic_slice_in_dim", "dynamic_index_in_dim",
           "dynamic_update_slice_in_dim", "dynamic_update_index_in_dim",
           "psum", "pmean", "all_gather", "psum_scatter", "ppermute", "all_to_all", "axis_index"]


def psum(x, axis_name):
    """The sum of ``x`` over the ranks of ``axis_name``, on each of them. VJP: psum."""
    return C.psum(x, current_mesh("psum"), axis_name)


def pmean(x, axis_name):
    """The mean of ``x`` over the ranks of ``axis_name``."""
    mesh = current_mesh("pmean")
    return C.psum(x, mesh, axis_name) / mesh.size(axis_name)


def all_gather(x, axis_name, *, axis=0, tiled=False):
    """Every rank's ``x`` along ``axis_name``: stacked on a new ``axis``, or concatenated with ``tiled``.
    VJP: psum_scatter."""
    return C.all_gather(x, current_mesh("all_gather"), axis_name, axis=axis, tiled=tiled)


def psum_scatter(x, axis_name, *, scatter_dimension=0, tiled=False):
    """psum, of which each rank keeps its block along ``scatter_dimension`` (reduce_scatter). VJP: all_gather."""
    return C.psum_scatter(x, current_mesh("psum_scatter"), axis_name, axis=scatter_dimension, tiled=tiled)


def ppermute(x, axis_name, perm):
    """``x`` sent from index s to index d of ``axis_name`` for each (s, d) in ``perm``; zeros where none
    arrives. VJP: the inverse permutation."""
    return C.ppermute(x, current_mesh("ppermute"), axis_name, perm)


def all_to_all(x, axis_name, split_axis, concat_axis):
    """Blocks of ``x`` along ``split_axis`` sent to each rank of ``axis_name``, concatenated along
    ``concat_axis`` (tiled, as ``jax.lax.all_to_all(..., tiled=True)``)."""
    return C.all_to_all(x, current_mesh("all_to_all"), axis_name, split_axis, concat_axis)


def axis_index(axis_name):
    """This rank's index along ``axis_name`` (an int32 scalar array; no communication)."""
    from . import int32
    from .ops import asarray
    from .shard_map import current_device
    mesh, device = current_mesh("axis_index"), current_device("axis_index")  # the shards' device, not a default
    return asarray(mesh.index(axis_name), dtype=int32, device=device)
