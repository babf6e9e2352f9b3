"""fa.jacfwd, fa.jacrev, fa.hessian and fa.linearize (JAX's API and semantics), built on jvp/vjp and vmap.

jacfwd pushes the standard basis of the differentiated inputs through fa.jvp under one fa.vmap (each
basis vector gives one column of the Jacobian); jacrev pulls the standard basis of the outputs back
through the function fa.vjp returns, under one vmap (one row each). Both record ordinary lazy graphs,
so they compose with jit, vmap, grad and each other. hessian is jacfwd(jacrev(f)), JAX's choice:
forward over reverse.

Result structure, as JAX's: the output's pytree, and at each output leaf the differentiated
argument's pytree (a tuple of them for a tuple ``argnums``) whose leaves have shape
``output_leaf.shape + input_leaf.shape``.
"""
from __future__ import annotations

import functools

from .. import tree_util as tu
from .autodiff import _differentiable, _prepare, check_has_aux, jvp, vjp
from .batching import vmap
from .recording import check_callable

__all__ = ["hessian", "jacfwd", "jacrev", "linearize"]


def _offsets(leaves):
    """Where each leaf's entries start in the flat concatenation of all of them, and the total size."""
    offsets, total = [], 0
    for leaf in leaves:
        offsets.append(total)
        total += leaf.size
    return offsets, total


def _basis(leaves):
    """The standard basis of the flat concatenation of ``leaves``, split per leaf: for each leaf an
    array of shape ``(total,) + leaf.shape`` (row r is basis vector r's part in that leaf)."""
    from ..ops import eye
    offsets, total = _offsets(leaves)
    return [eye(total, leaf.size, k=-off, dtype=leaf.dtype, device=leaf.device).reshape((total,) + leaf.shape)
            for leaf, off in zip(leaves, offsets)]


def _nest(out_tree, in_tree, single, block):
    """The Jacobian pytree: ``out_tree`` on the outside, ``in_tree`` (the tuple of differentiated
    arguments, unwrapped when ``argnums`` was an int) inside; ``block(o, i)`` is one leaf's block."""
    per_out = []
    for o in range(out_tree.num_leaves):
        inner = tu.tree_unflatten(in_tree, [block(o, i) for i in range(in_tree.num_leaves)])
        per_out.append(inner[0] if single else inner)
    return tu.tree_unflatten(out_tree, per_out)


def jacfwd(fun, argnums=0, has_aux=False):
    """The Jacobian of ``fun`` w.r.t. argument(s) ``argnums``, by forward mode (JAX's jax.jacfwd): one
    jvp per input entry, vectorized with vmap. With ``has_aux``, ``fun`` returns (output, aux) and the
    function (jacobian, aux)."""
    check_callable(fun, "jacfwd")
    check_has_aux(has_aux, "jacfwd")

    @functools.wraps(fun)
    def jacfun(*args, **kwargs):
        partial, dyn, single = _prepare(fun, args, kwargs, argnums, "jacfwd")
        leaves, in_tree = tu.tree_flatten(dyn)

        def push(*tangents):
            return jvp(partial, dyn, tu.tree_unflatten(in_tree, tangents), has_aux=has_aux)
        # the output and aux do not depend on the tangents: out_axes None keeps them unbatched
        res = vmap(push, out_axes=(None, 0, None) if has_aux else (None, 0))(*_basis(leaves))
        y_leaves, y_tree = tu.tree_flatten(res[0])
        columns = tu.tree_leaves(res[1])  # per output leaf: (total inputs,) + its shape
        offsets, _ = _offsets(leaves)

        def block(o, i):
            y, x = y_leaves[o], leaves[i]
            part = columns[o][offsets[i]:offsets[i] + x.size].reshape(x.size, y.size)
            return part.mT.reshape(y.shape + x.shape)
        jac = _nest(y_tree, in_tree, single, block)
        return (jac, res[2]) if has_aux else jac
    return jacfun


def jacrev(fun, argnums=0, has_aux=False):
    """The Jacobian of ``fun`` w.r.t. argument(s) ``argnums``, by reverse mode (JAX's jax.jacrev): one
    vjp per output entry, vectorized with vmap. ``fun``'s outputs must be real-valued. With ``has_aux``,
    ``fun`` returns (output, aux) and the function (jacobian, aux)."""
    check_callable(fun, "jacrev")
    check_has_aux(has_aux, "jacrev")

    @functools.wraps(fun)
    def jacfun(*args, **kwargs):
        partial, dyn, single = _prepare(fun, args, kwargs, argnums, "jacrev")
        leaves, in_tree = tu.tree_flatten(dyn)
        res = vjp(partial, *dyn, has_aux=has_aux)
        y_leaves, y_tree = tu.tree_flatten(res[0])
        for y in y_leaves:
            if not _differentiable(y.dtype):
                raise TypeError(f"jacrev requires real-valued (floating-point) outputs, got one of dtype {y.dtype}; "
                                "use jacfwd")
        pull = res[1]
        rows = vmap(lambda *cts: pull(tu.tree_unflatten(y_tree, cts)))(*_basis(y_leaves))
        rows = tu.tree_leaves(rows)  # per input leaf: (total outputs,) + its shape
        offsets, _ = _offsets(y_leaves)

        def block(o, i):
            y, x = y_leaves[o], leaves[i]
            return rows[i][offsets[o]:offsets[o] + y.size].reshape(y.shape + x.shape)
        jac = _nest(y_tree, in_tree, single, block)
        return (jac, res[2]) if has_aux else jac
    return jacfun


def hessian(fun, argnums=0, has_aux=False):
    """The Hessian of scalar-valued ``fun`` (JAX's jax.hessian): jacfwd(jacrev(fun)). For a tuple
    ``argnums`` it is nested: ``h[i][j]`` is the block of arguments i and j."""
    return jacfwd(jacrev(fun, argnums, has_aux), argnums, has_aux)


def linearize(fun, *primals, has_aux=False):
    """(fun(*primals), f_jvp[, aux]) as JAX's jax.linearize: ``f_jvp(*tangents)`` is the JVP of ``fun`` at
    ``primals``. Each call of ``f_jvp`` records ``fun`` again (nothing is kept linearized), so the
    scheduler recomputes the primal values the tangent needs: call fa.jvp directly to get both at once."""
    out = fun(*primals)
    aux = None
    if has_aux:
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise TypeError(f"linearize with has_aux=True: the function must return a pair (output, aux), "
                            f"got {type(out).__name__}")
        out, aux = out

    def f_jvp(*tangents):
        if len(tangents) != len(primals):
            raise TypeError(f"linearize: f_jvp takes one tangent per primal ({len(primals)}), got {len(tangents)}")
        return jvp(fun, primals, tangents, has_aux=has_aux)[1]
    return (out, f_jvp, aux) if has_aux else (out, f_jvp)
