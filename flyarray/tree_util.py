"""Pytrees, as ``jax.tree_util``: nested containers whose leaves are arrays (or anything else).

Containers: tuple, list, dict and collections.defaultdict (keys in sorted order, as JAX),
collections.OrderedDict (keys in insertion order, as JAX; a torch ``state_dict()`` is one), None (a
container with no children), namedtuples, and any class registered with ``register_pytree_node``.
Everything else is a leaf.

    leaves, treedef = fa.tree_util.tree_flatten({"w": w, "b": (b1, b2)})
    params = fa.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)

Flattening is iterative in the number of nodes visited per level and recursive only in nesting
depth (pytrees are shallow; graphs are not).
"""
from __future__ import annotations

import collections
from typing import Any, Callable, NamedTuple

__all__ = ["PyTreeDef", "register_pytree_node", "tree_flatten", "tree_unflatten", "tree_map", "tree_leaves",
           "tree_structure", "treedef_is_leaf", "all_leaves"]


class _Registry(NamedTuple):
    flatten: Callable  # obj -> (children, aux_data)
    unflatten: Callable  # (aux_data, children) -> obj


_REGISTRY: dict = {}


def register_pytree_node(nodetype, flatten_func, unflatten_func):
    """Make ``nodetype`` a container: ``flatten_func(obj) -> (children, aux_data)`` and
    ``unflatten_func(aux_data, children) -> obj`` (JAX's signature; aux_data must be hashable)."""
    if not isinstance(nodetype, type):
        raise TypeError(f"register_pytree_node: nodetype must be a class, got {nodetype!r}")
    for name, fn in (("flatten_func", flatten_func), ("unflatten_func", unflatten_func)):
        if not callable(fn):
            raise TypeError(f"register_pytree_node: {name} must be callable, got {fn!r}")
    if nodetype in _REGISTRY:
        raise ValueError(f"register_pytree_node: {nodetype.__name__} is already registered")
    _REGISTRY[nodetype] = _Registry(flatten_func, unflatten_func)


def _sorted_keys(d) -> list:
    """A dict's keys in the order its leaves flatten in (JAX's: sorted), or a TypeError saying why they cannot be."""
    try:
        return sorted(d)
    except TypeError as e:
        raise TypeError(f"a dict in a pytree flattens in sorted key order, but its keys {list(d)!r} cannot be "
                        f"sorted ({e}); use keys of one type") from None


def _dict_flatten(d):
    keys = _sorted_keys(d)
    return [d[k] for k in keys], tuple(keys)


def _dict_unflatten(keys, children):
    return dict(zip(keys, children))


register_pytree_node(tuple, lambda t: (list(t), None), lambda _, c: tuple(c))
register_pytree_node(list, lambda t: (list(t), None), lambda _, c: list(c))
register_pytree_node(dict, _dict_flatten, _dict_unflatten)
register_pytree_node(type(None), lambda _: ([], None), lambda _, c: None)
register_pytree_node(collections.OrderedDict, lambda d: (list(d.values()), tuple(d)),
                     lambda keys, c: collections.OrderedDict(zip(keys, c)))
def _defaultdict_flatten(d):
    children, keys = _dict_flatten(d)
    return children, (d.default_factory, keys)


register_pytree_node(collections.defaultdict, _defaultdict_flatten,
                     lambda aux, c: collections.defaultdict(aux[0], zip(aux[1], c)))


def _is_namedtuple(x) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields") and type(x) is not tuple


def _rule(x):
    t = type(x)
    rule = _REGISTRY.get(t)
    if rule is not None:
        return rule
    if _is_namedtuple(x):
        return _Registry(lambda nt: (list(nt), None), lambda _, c, _t=t: _t(*c))
    return None


class PyTreeDef:
    """The structure of a pytree: a node type, its aux data and its children's structures (a leaf: None)."""
    __slots__ = ("kind", "aux", "children", "num_leaves")

    def __init__(self, kind, aux, children):
        self.kind = kind  # None for a leaf, else the container type
        self.aux = aux
        self.children = tuple(children)
        self.num_leaves = 1 if kind is None else sum(c.num_leaves for c in self.children)

    @property
    def num_nodes(self) -> int:
        return 1 + sum(c.num_nodes for c in self.children)

    def _key(self):
        return (self.kind, self.aux, tuple(c._key() for c in self.children))

    def __eq__(self, other):
        return isinstance(other, PyTreeDef) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def unflatten(self, leaves):
        return tree_unflatten(self, leaves)

    def __repr__(self):
        if self.kind is None:
            return "*"
        if self.kind is type(None):
            return "None"
        inner = ", ".join(map(repr, self.children))
        if self.kind is dict:
            inner = ", ".join(f"{k!r}: {c!r}" for k, c in zip(self.aux, self.children))
            return "PyTreeDef({" + inner + "})"
        return f"PyTreeDef({self.kind.__name__}({inner}))"


_LEAF = PyTreeDef(None, None, ())


def tree_flatten(tree, is_leaf: Callable[[Any], bool] | None = None):
    """(leaves in order, treedef). ``is_leaf(x) -> True`` stops at x, as JAX's argument."""
    if is_leaf is not None and not callable(is_leaf):
        raise TypeError(f"tree_flatten: is_leaf must be a callable or None, got {is_leaf!r}")
    leaves: list = []
    return leaves, _flatten(tree, leaves, is_leaf)


def _flatten(x, leaves, is_leaf):
    if is_leaf is not None and is_leaf(x):
        leaves.append(x)
        return _LEAF
    rule = _rule(x)
    if rule is None:
        leaves.append(x)
        return _LEAF
    children, aux = rule.flatten(x)
    return PyTreeDef(type(x), aux, [_flatten(c, leaves, is_leaf) for c in children])


def tree_unflatten(treedef: PyTreeDef, leaves):
    """The pytree of ``treedef``'s structure with ``leaves`` (an iterable) in flatten order."""
    _check_treedef(treedef, "tree_unflatten")
    try:
        leaves = list(leaves)
    except TypeError:
        raise TypeError(f"tree_unflatten: leaves must be an iterable, got {type(leaves).__name__}") from None
    if len(leaves) != treedef.num_leaves:
        raise ValueError(f"tree_unflatten: the structure {treedef} has {treedef.num_leaves} leaves, "
                         f"got {len(leaves)}")
    it = iter(leaves)
    return _unflatten(treedef, it)


def _unflatten(treedef, it):
    if treedef.kind is None:
        return next(it)
    children = [_unflatten(c, it) for c in treedef.children]
    rule = _REGISTRY.get(treedef.kind)
    if rule is None:  # a namedtuple
        return treedef.kind(*children)
    return rule.unflatten(treedef.aux, children)


def tree_leaves(tree, is_leaf=None) -> list:
    """The leaves of ``tree`` in flattening order (as jax.tree_util.tree_leaves); None is an empty node."""
    return tree_flatten(tree, is_leaf)[0]


def tree_structure(tree, is_leaf=None) -> PyTreeDef:
    """The ``PyTreeDef`` of ``tree`` (as jax.tree_util.tree_structure)."""
    return tree_flatten(tree, is_leaf)[1]


def treedef_is_leaf(treedef: PyTreeDef) -> bool:
    """Whether ``treedef`` is a single node (as jax.tree_util.treedef_is_leaf, which asks for one node): a leaf,
    and also None or an empty container, which have no children."""
    _check_treedef(treedef, "treedef_is_leaf")
    return treedef.num_nodes == 1


def _check_treedef(treedef, fn):
    if not isinstance(treedef, PyTreeDef):
        raise TypeError(f"{fn}: expected a PyTreeDef (from tree_flatten or tree_structure), got "
                        f"{type(treedef).__name__}")


def all_leaves(iterable) -> bool:
    """Whether every item of ``iterable`` is a leaf, i.e. no registered container (as JAX's all_leaves)."""
    try:
        iter(iterable)
    except TypeError:
        raise TypeError(f"all_leaves: iterable must be an iterable of candidate leaves, got "
                        f"{type(iterable).__name__}") from None
    return all(tree_structure(x).kind is None for x in iterable)


def tree_map(f: Callable, tree, *rest, is_leaf=None):
    """``f`` over the leaves of ``tree`` (and the matching leaves of each tree in ``rest``, which must
    have ``tree``'s structure, or extend it below its leaves as JAX allows)."""
    if not callable(f):
        raise TypeError(f"tree_map: f must be callable, got {f!r}")
    leaves, treedef = tree_flatten(tree, is_leaf)
    others = [_flatten_up_to(treedef, r, i + 1) for i, r in enumerate(rest)]
    return tree_unflatten(treedef, [f(*xs) for xs in zip(leaves, *others)])


def _flatten_up_to(treedef: PyTreeDef, tree, position, name=None):
    """``tree``'s subtrees at ``treedef``'s leaves; a ValueError when the structures differ, naming the tree
    ``name`` (else tree_map's argument ``position``)."""
    name = name or f"tree_map: argument {position}"
    out: list = []
    stack = [(treedef, tree)]
    while stack:
        td, x = stack.pop()
        if td.kind is None:
            out.append(x)
            continue
        rule = _rule(x)
        if type(x) is not td.kind or rule is None:
            raise ValueError(f"{name} has a {type(x).__name__} where the first tree has "
                             f"a {td.kind.__name__} ({td})")
        children, aux = rule.flatten(x)
        if aux != td.aux or len(children) != len(td.children):
            raise ValueError(f"{name}: its {type(x).__name__} differs in structure from the "
                             f"first tree's ({td})")
        stack.extend(reversed(list(zip(td.children, children))))
    return out
