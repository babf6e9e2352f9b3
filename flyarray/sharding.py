"""Meshes and shardings (JAX's names): where the pieces of a logical array live across processes.

flyarray runs multi-controller, as JAX does on several hosts: one process per device (started by
``torchrun``), each running the same program and holding *its own shard* of every sharded array.
A ``Mesh`` lays the ranks of torch.distributed's default process group out as a 1-D or 2-D grid with
named axes; a ``PartitionSpec`` says, per array dimension, which mesh axes split it (None: not split);
a ``NamedSharding`` pairs the two. ``fa.device_put`` / ``fa.device_get`` and the propagation rules
live in flyarray/sharded.py; the collectives in flyarray/collectives.py (docs/distributed.md).
"""
from __future__ import annotations

import math

__all__ = ["Mesh", "PartitionSpec", "P", "NamedSharding", "ShardedArray", "device_put", "device_get", "from_local",
           "apply", "elementwise"]


def _dist():
    import torch.distributed as dist
    if not dist.is_available():
        raise RuntimeError("fa.sharding needs torch.distributed, which this torch build lacks")
    if not dist.is_initialized():
        raise RuntimeError("fa.sharding.Mesh needs torch.distributed's default process group: call "
                           "torch.distributed.init_process_group(...) first (torchrun sets up its environment)")
    return dist


class Mesh:
    """Ranks 0..world-1 of the default process group laid out row-major as ``shape`` with ``axis_names``.

    ``Mesh(("dp",), (2,))`` or ``Mesh(("dp", "tp"), (2, 4))``. Creating a mesh is collective: every rank
    must create the same meshes in the same order (each mesh axis gets its own process group).
    """

    def __init__(self, axis_names, shape):
        axis_names, shape = _check_mesh_args(axis_names, shape)
        dist = _dist()
        world = dist.get_world_size()
        if math.prod(shape) != world:
            raise ValueError(f"Mesh: shape {shape} holds {math.prod(shape)} ranks but the default process group "
                             f"has {world} (world size); the product of the shape must equal it")
        self.axis_names, self.shape = axis_names, shape
        self.rank = dist.get_rank()
        self.coords = _unravel(self.rank, shape)
        # Every rank must call new_group for every group in the same order, so all are made here, eagerly.
        self._groups = {names: self._make_group(names, dist) for names in _axis_subsets(axis_names)}

    def _make_group(self, names, dist):
        if len(names) == len(self.axis_names):
            return None  # the whole mesh is the default group
        mine = None
        for fixed in _coords_of(self.shape, [i for i, a in enumerate(self.axis_names) if a not in names]):
            ranks = sorted(r for r in range(math.prod(self.shape)) if _matches(_unravel(r, self.shape), fixed))
            group = dist.new_group(ranks)
            if self.rank in ranks:
                mine = group
        return mine

    def size(self, names) -> int:
        """How many ranks the mesh axes ``names`` (a name or a tuple of names) span."""
        return math.prod(self.shape[self.axis_names.index(a)] for a in self.check_axes(names))

    def index(self, names) -> int:
        """This rank's position along the mesh axes ``names`` (row-major over them)."""
        idx = 0
        for a in self.check_axes(names):
            i = self.axis_names.index(a)
            idx = idx * self.shape[i] + self.coords[i]
        return idx

    def group(self, names):
        """The torch.distributed process group of this rank along ``names`` (None: the default group)."""
        return self._groups[tuple(sorted(self.check_axes(names), key=self.axis_names.index))]

    def group_ranks(self, names) -> list:
        """The global ranks of this rank's group along ``names``, in axis-index order."""
        names = self.check_axes(names)
        return sorted((r for r in range(math.prod(self.shape))
                       if all(_unravel(r, self.shape)[i] == c for i, c in enumerate(self.coords)
                              if self.axis_names[i] not in names)),
                      key=lambda r: self._index_of(r, names))

    def _index_of(self, rank, names):
        coords, idx = _unravel(rank, self.shape), 0
        for a in names:
            i = self.axis_names.index(a)
            idx = idx * self.shape[i] + coords[i]
        return idx

    def check_axes(self, names) -> tuple:
        if isinstance(names, str):
            names = (names,)
        elif isinstance(names, (tuple, list)):
            names = tuple(names)
        else:
            raise TypeError(f"mesh axes must be a name or a tuple of names of {self.axis_names}, got {names!r}")
        for a in names:
            if not isinstance(a, str):
                raise TypeError(f"mesh axes must be a name or a tuple of names of {self.axis_names}, got {names!r}")
            if a not in self.axis_names:
                raise ValueError(f"mesh axis {a!r} is not in this mesh's axes {self.axis_names}")
        if len(set(names)) != len(names):
            raise ValueError(f"mesh axes {names} name an axis twice")
        return names

    def __repr__(self):
        return f"Mesh({dict(zip(self.axis_names, self.shape))})"


def _check_mesh_args(axis_names, shape):
    axis_names = (axis_names,) if isinstance(axis_names, str) else tuple(axis_names)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if not all(isinstance(a, str) for a in axis_names) or len(set(axis_names)) != len(axis_names):
        raise ValueError(f"Mesh: axis_names must be distinct strings, got {axis_names}")
    if len(axis_names) != len(shape):
        raise ValueError(f"Mesh: {len(axis_names)} axis names {axis_names} for a shape of {len(shape)} dims {shape}")
    if not 1 <= len(shape) <= 2:
        raise ValueError(f"Mesh: 1-D and 2-D meshes are supported, got shape {shape}")
    if not all(isinstance(s, int) and s >= 1 for s in shape):
        raise ValueError(f"Mesh: shape must be positive ints, got {shape}")
    return axis_names, shape


def _unravel(rank, shape):
    coords = []
    for s in reversed(shape):
        coords.append(rank % s)
        rank //= s
    return tuple(reversed(coords))


def _coords_of(shape, dims):
    """Every combination of coordinates over ``dims`` (dict dim -> coordinate)."""
    combos = [{}]
    for d in dims:
        combos = [dict(c, **{str(d): i}) for c in combos for i in range(shape[d])]
    return [{int(k): v for k, v in c.items()} for c in combos]


def _matches(coords, fixed):
    return all(coords[d] == v for d, v in fixed.items())


def _axis_subsets(axis_names):
    subsets = [(a,) for a in axis_names]
    return subsets + ([tuple(axis_names)] if len(axis_names) > 1 else [])


class PartitionSpec(tuple):
    """Per array dimension: None (not split), a mesh axis name, or a tuple of names (split over both).
    Trailing dimensions not named are not split: ``P("dp")`` on a 2-D array is ``P("dp", None)``."""

    def __new__(cls, *parts):
        for p in parts:
            names = (p,) if isinstance(p, str) else p
            if names is not None and not (isinstance(names, tuple) and all(isinstance(a, str) for a in names)):
                raise TypeError(f"PartitionSpec entries are None, a mesh axis name or a tuple of names; got {p!r}")
        return super().__new__(cls, parts)

    def __repr__(self):
        return "P(" + ", ".join(map(repr, self)) + ")"


P = PartitionSpec


class NamedSharding:
    """A mesh and a PartitionSpec: how a logical array is split across the mesh's ranks."""

    def __init__(self, mesh: Mesh, spec=PartitionSpec()):
        if not isinstance(mesh, Mesh):
            raise TypeError(f"NamedSharding: mesh must be an fa.sharding.Mesh, got {type(mesh).__name__}")
        spec = spec if isinstance(spec, PartitionSpec) else PartitionSpec(*spec)
        used = [a for p in spec if p is not None for a in ((p,) if isinstance(p, str) else p)]
        mesh.check_axes(used)  # unknown or repeated mesh axes fail here, naming them
        for p in spec:  # a dim split over several axes: in the mesh's order, which is the ranks' order in a group
            if isinstance(p, tuple) and list(p) != sorted(p, key=mesh.axis_names.index):
                raise ValueError(f"NamedSharding: the axes {p} of one dimension must follow the mesh's order "
                                 f"{mesh.axis_names}")
        self.mesh, self.spec = mesh, spec

    def dim_axes(self, ndim: int) -> tuple:
        """Per dimension (``ndim`` of them) the tuple of mesh axes splitting it (``()``: not split)."""
        if len(self.spec) > ndim:
            raise ValueError(f"PartitionSpec {self.spec!r} has {len(self.spec)} entries for an array of {ndim} dims")
        parts = tuple(self.spec) + (None,) * (ndim - len(self.spec))
        return tuple(() if p is None else ((p,) if isinstance(p, str) else tuple(p)) for p in parts)

    @property
    def is_replicated(self) -> bool:
        return all(p is None or p == () for p in self.spec)

    def _key(self):
        return (id(self.mesh), tuple(self.dim_axes(len(self.spec))))

    def __eq__(self, other):
        return isinstance(other, NamedSharding) and self.mesh is other.mesh and \
            _normalized(self.spec) == _normalized(other.spec)

    def __hash__(self):
        return hash((id(self.mesh), _normalized(self.spec)))

    def __repr__(self):
        return f"NamedSharding({self.mesh!r}, {self.spec!r})"


def _normalized(spec):
    """Drop trailing Nones and spell each entry as a tuple, so P('x') == P('x', None) == P(('x',))."""
    parts = [() if p is None else ((p,) if isinstance(p, str) else tuple(p)) for p in spec]
    while parts and parts[-1] == ():
        parts.pop()
    return tuple(parts)


_SHARDED = ("ShardedArray", "device_put", "device_get", "from_local", "apply", "elementwise")


def __getattr__(name):
    # fa.sharding is the user's one place for sharding; the array type and its rules live in sharded.py,
    # which imports this module (so they are looked up on first use, not imported here).
    if name in _SHARDED:
        from . import sharded
        return getattr(sharded, name)
    raise AttributeError(f"module 'flyarray.sharding' has no attribute {name!r}")
