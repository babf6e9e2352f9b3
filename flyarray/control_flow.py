"""Structured control flow (JAX's lax.cond, switch, fori_loop, while_loop, scan, map), recorded by unrolling.

flyarray records a graph as Python runs, so a loop is its iterations recorded one after another and a
choice is either the branch taken (when the predicate has a value) or both branches and a ``where``
(when it has none: under fa.jit's tracing or fa.vmap's batching). Built from the ordinary ops, every
transform applies unchanged: grad, jvp and vmap see a loop as the ops its iterations recorded, fa.jit
traces it into one plan, and the scheduler fuses across iterations. What JAX's versions check is
checked here too, before anything runs: the carry keeps its structure, shapes and dtypes, both branches
return the same types, and every xs leaf has the scanned length.

What unrolling cannot do is a loop whose trip count has no value while recording: a ``while_loop`` whose
predicate depends on fa.jit's traced arguments or fa.vmap's batched ones, or ``fori_loop`` bounds that do.
Those raise ConcretizationError naming the argument; JAX would compile them to one loop node.
"""
from __future__ import annotations

import builtins
import operator

from . import plan
from ._array import Array
from .tree_util import tree_flatten, tree_unflatten

__all__ = ["cond", "switch", "select", "fori_loop", "while_loop", "scan", "map"]


def cond(pred, true_fun, false_fun, *operands):
    """``true_fun(*operands)`` if ``pred`` else ``false_fun(*operands)``; both must return the same pytree
    of the same shapes and dtypes (checked).

    ``pred`` is a bool or a scalar array. With a value, only the chosen branch is computed (both are
    recorded, which costs no device time); the predicate is computed together with the operands, so a loop
    around the cond starts its next step from their values instead of recomputing their history. Without one (it depends on fa.jit's traced or fa.vmap's batched
    arguments), both are computed and a ``where`` picks, so a gradient through the branch not taken is 0
    times its derivative: a NaN there (log at 0) still reaches the result, as with JAX's select."""
    _check_function(true_fun, "cond", "true_fun")
    _check_function(false_fun, "cond", "false_fun")
    pred = _scalar(pred, "cond", "pred", integer=False)
    outs = [_call(f, operands, "cond", name) for f, name in ((true_fun, "true_fun"), (false_fun, "false_fun"))]
    _check_same_types(outs[0], outs[1], "cond", "true_fun's output", "false_fun's output")
    if not _traced(pred):
        return outs[0] if _value(pred, operands) else outs[1]
    return _select(pred, outs[0], outs[1])


def switch(index, branches, *operands):
    """``branches[index](*operands)``, ``index`` clamped to the branches (JAX's rule); every branch returns
    the same pytree of shapes and dtypes. Without a value for ``index`` (fa.jit / fa.vmap), every branch is
    computed and ``where``s pick."""
    if not isinstance(branches, (list, tuple)) or not branches:
        raise TypeError(f"fa.lax.switch: branches must be a non-empty list or tuple of functions, got {branches!r:.60}")
    for i, f in enumerate(branches):
        _check_function(f, "switch", f"branches[{i}]")
    index = _scalar(index, "switch", "index", integer=True, bool_ok=False)
    outs = [_call(f, operands, "switch", f"branches[{i}]") for i, f in enumerate(branches)]
    for i, out in enumerate(outs[1:], 1):
        _check_same_types(outs[0], out, "switch", "branches[0]'s output", f"branches[{i}]'s output")
    if not _traced(index):
        return outs[builtins.min(builtins.max(int(_value(index, operands)), 0), len(outs) - 1)]
    result = outs[-1]
    for i in reversed(range(len(outs) - 1)):   # the first i with index <= i wins: index < 0 picks branch 0
        result = _select(index <= i, outs[i], result)
    return result


def select(pred, on_true, on_false):
    """``on_true`` where ``pred`` is true, else ``on_false``, elementwise (jax.lax.select): unlike ``fa.where``
    nothing broadcasts or promotes: ``pred`` is a bool array of the operands' shape (or a scalar), and the
    operands have one shape and dtype."""
    from .namespace_info import isdtype
    pred = _array(pred, "select", "pred")
    on_true, on_false = _array(on_true, "select", "on_true"), _array(on_false, "select", "on_false")
    if (on_true.shape, on_true.dtype) != (on_false.shape, on_false.dtype):
        raise TypeError(f"fa.lax.select: on_true is {_type_name((on_true.shape, on_true.dtype))} and on_false "
                        f"{_type_name((on_false.shape, on_false.dtype))}; they must match")
    if not isdtype(pred.dtype, "bool") or pred.shape not in ((), on_true.shape):
        raise TypeError(f"fa.lax.select: pred must be a bool array of shape () or {on_true.shape}, got "
                        f"{_type_name((pred.shape, pred.dtype))}")
    return _select(pred, on_true, on_false)


def fori_loop(lower, upper, body_fun, init_val, *, unroll=None):
    """``val = body_fun(i, val)`` for ``i`` in ``range(lower, upper)``, from ``init_val``; returns ``val``.

    The bounds are ints (or scalar integer arrays with values); ``i`` reaches ``body_fun`` as a Python int, so
    ``xs[i]`` is a static slice. ``body_fun`` must return ``init_val``'s structure, shapes and dtypes.
    ``unroll`` is accepted for JAX's signature: every iteration is recorded (unrolled) anyway."""
    _check_function(body_fun, "fori_loop", "body_fun")
    _check_unroll(unroll, "fori_loop", allow_none=True)
    lower, upper = (_static_int(b, "fori_loop", name) for b, name in ((lower, "lower"), (upper, "upper")))
    val = _as_arrays(init_val, "fori_loop", "init_val")
    if lower >= upper:   # recorded once all the same (never computed), so a bad body fails as in JAX
        _next_carry(body_fun(lower, val), val, "fori_loop", "body_fun")
    for i in range(lower, upper):
        val = _next_carry(body_fun(i, val), val, "fori_loop", "body_fun")
    return val


def while_loop(cond_fun, body_fun, init_val):
    """``val = body_fun(val)`` while ``cond_fun(val)``, from ``init_val``; returns ``val``.

    ``cond_fun`` returns a bool or a scalar bool array, whose value decides each iteration (one wait for the
    device an iteration; the carry is computed with it, so the next iteration starts from its values), so the
    predicate cannot depend on fa.jit's traced or fa.vmap's batched arguments (ConcretizationError): use
    fori_loop with bounds known while tracing, or run the loop outside. Each iteration's body is recorded (and
    checked) before its predicate is evaluated, so a bad body fails before anything runs."""
    _check_function(cond_fun, "while_loop", "cond_fun")
    _check_function(body_fun, "while_loop", "body_fun")
    val = _as_arrays(init_val, "while_loop", "init_val")
    while True:
        following = _next_carry(body_fun(val), val, "while_loop", "body_fun")
        if not _loop_predicate(cond_fun(val), val):
            return val
        val = following


def scan(f, init, xs=None, length=None, reverse=False, unroll=1):
    """JAX's scan: ``carry, y = f(carry, x)`` for each ``x`` along the leading axis of ``xs`` (a pytree of
    arrays of one leading length, or None with ``length``); returns ``(carry, ys)``, the ``y``s stacked on a new
    leading axis. ``reverse`` walks from the end, and ``ys[i]`` still belongs to ``xs[i]``. The carry keeps
    its structure, shapes and dtypes (checked); ``unroll`` is accepted for JAX's signature (every step is
    recorded anyway)."""
    _check_function(f, "scan", "f")
    _check_unroll(unroll, "scan", allow_none=False)
    if not isinstance(reverse, bool):
        raise TypeError(f"fa.lax.scan: reverse must be True or False, got {reverse!r:.60}")
    x_leaves, x_tree = tree_flatten(xs)
    x_leaves = [_array(x, "scan", f"xs leaf {i}") for i, x in enumerate(x_leaves)]
    n = _scan_length(x_leaves, length)
    carry = _as_arrays(init, "scan", "init")
    ys = [None] * n
    for i in (reversed(range(n)) if reverse else range(n)):
        carry, ys[i] = _scan_step(f, carry, tree_unflatten(x_tree, [x[i] for x in x_leaves]))
    if n == 0:   # f still runs once (recorded, never computed) to learn the ys' types, as JAX traces it
        from .ops import zeros
        x = tree_unflatten(x_tree, [zeros(a.shape[1:], dtype=a.dtype, device=a.device) for a in x_leaves])
        return carry, _empty_stack(_scan_step(f, carry, x)[1])
    return carry, _stack_steps(ys)


def map(f, xs):
    """``f`` over the leading axis of the pytree ``xs``, the results stacked (JAX's lax.map: a scan with no
    carry)."""
    _check_function(f, "map", "f")
    if not tree_flatten(xs)[0]:
        raise ValueError("fa.lax.map: xs holds no arrays to map over")
    return scan(lambda carry, x: (carry, f(x)), (), xs)[1]


# --- checks and helpers ---

def _check_function(f, who, name):
    if not callable(f):
        raise TypeError(f"fa.lax.{who}: {name} must be a function, got {type(f).__name__} {f!r:.60}")


def _check_unroll(unroll, who, allow_none):
    if (unroll is None and allow_none) or isinstance(unroll, bool):
        return
    if not isinstance(unroll, int) or unroll < 1:
        raise ValueError(f"fa.lax.{who}: unroll must be a positive int or a bool, got {unroll!r:.60}")


def _array(x, who, name):
    from .ops.core import as_array
    x = as_array(x)
    if not isinstance(x, Array):
        raise TypeError(f"fa.lax.{who}: {name} must be an array (flyarray, numpy or torch), got {type(x).__name__}")
    return x


def _scalar(x, who, name, integer, bool_ok=True):
    """``x``, a Python number (an int when ``integer``) or a 0-d array of a bool (if ``bool_ok``) or (integer)
    numeric dtype, else a TypeError naming ``name``."""
    from .namespace_info import isdtype
    wanted = ("an integer" if integer else "a bool or real") + " scalar (a Python number or an array of shape ())"
    if isinstance(x, bool) and not bool_ok:
        raise TypeError(f"fa.lax.{who}: {name} must be {wanted.replace('a bool or ', '')}, got a bool")
    if isinstance(x, int if integer else (int, float)):
        return x
    if not isinstance(x, Array):
        from .ops.core import as_array
        x = as_array(x)
        if not isinstance(x, Array):
            raise TypeError(f"fa.lax.{who}: {name} must be {wanted}, got {type(x).__name__} {x!r:.40}")
    kinds = ("integral",) if integer else ("integral", "real floating")
    if x.shape != () or not (isdtype(x.dtype, kinds) or (bool_ok and isdtype(x.dtype, "bool"))):
        raise TypeError(f"fa.lax.{who}: {name} must be {wanted}, got {x.dtype} of shape {x.shape}")
    return x


def _value(x, operands):
    """``x``'s value, computed with the arrays among ``operands`` that have values: a loop's next step then starts
    from them instead of recomputing their history with every predicate (quadratic in the steps)."""
    if not isinstance(x, Array):
        return x
    from . import eval as evaluate
    evaluate(x, *[a for a in tree_flatten(operands)[0] if isinstance(a, Array) and not _traced(a)])
    return x.item()


def _traced(x) -> bool:
    return isinstance(x, Array) and plan.depends_on_traced([x._node])


def _call(f, operands, who, name):
    return _as_arrays(f(*operands), who, f"{name}'s output")


def _as_arrays(tree, who, what):
    """``tree`` with each leaf an Array (Python and numpy scalars and torch tensors converted)."""
    from .ops import asarray
    leaves, treedef = tree_flatten(tree)
    out = []
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, Array):
            try:
                leaf = asarray(leaf)
            except (TypeError, ValueError) as e:
                raise TypeError(f"fa.lax.{who}: {what}, leaf {i}, is not an array or a number: "
                                f"{type(leaf).__name__} ({e})") from None
        out.append(leaf)
    return tree_unflatten(treedef, out)


def _types(tree):
    leaves, treedef = tree_flatten(tree)
    return treedef, [(tuple(x.shape), x.dtype) for x in leaves]


def _check_same_types(a, b, who, a_name, b_name):
    (ta, la), (tb, lb) = _types(a), _types(b)
    if ta != tb:
        raise TypeError(f"fa.lax.{who}: {b_name} has the structure {tb}, {a_name} {ta}")
    for i, (x, y) in enumerate(zip(la, lb)):
        if x != y:
            raise TypeError(f"fa.lax.{who}: {b_name}, leaf {i}, is {_type_name(y)} where {a_name} has "
                            f"{_type_name(x)}")


def _type_name(t):
    shape, dtype = t
    return f"{dtype}{list(shape)}"


def _next_carry(out, carry, who, name):
    """``out`` as the next carry: ``carry``'s structure, shapes and dtypes, with Python numbers taking the
    carry leaf's dtype (JAX's weak types)."""
    from .ops import asarray
    leaves, treedef = tree_flatten(out)
    carry_leaves, carry_tree = tree_flatten(carry)
    if treedef != carry_tree:
        raise TypeError(f"fa.lax.{who}: {name} returned the structure {treedef}; the carry is {carry_tree}")
    try:
        leaves = [asarray(x, dtype=c.dtype, device=c.device) if _python_number_fits(x, c) else x
                  for x, c in zip(leaves, carry_leaves)]
    except (OverflowError, ValueError) as e:
        raise type(e)(f"fa.lax.{who}: {name}'s output does not fit the carry: {e}") from None
    out = _as_arrays(tree_unflatten(treedef, leaves), who, f"{name}'s output")
    _check_same_types(carry, out, who, "the carry", f"{name}'s output")
    return out


def _python_number_fits(x, carry_leaf) -> bool:
    """A Python number the carry leaf's dtype kind holds (bool in bool, int in int/float/complex, float in
    float/complex, complex in complex), as a weakly typed JAX scalar would."""
    from .namespace_info import isdtype
    kinds = {bool: ("bool",), int: ("integral", "real floating", "complex floating"),
             float: ("real floating", "complex floating"), complex: ("complex floating",)}
    return type(x) in kinds and isdtype(carry_leaf.dtype, kinds[type(x)])


def _static_int(x, who, name) -> int:
    if isinstance(x, int) and not isinstance(x, bool):
        return x
    x = _scalar(x, who, name, integer=True, bool_ok=False)
    if isinstance(x, Array) and _traced(x):
        raise plan.ConcretizationError(
            f"fa.lax.{who}: {name} depends on fa.jit's traced or fa.vmap's batched arguments. flyarray records a "
            f"loop by unrolling it, so its bounds need values while recording: pass them as static arguments "
            f"(fa.jit's static_argnums=) or compute them outside the transformed function.")
    return int(x)


def _loop_predicate(pred, carry) -> bool:
    from .namespace_info import isdtype
    if not isinstance(pred, (bool, Array)) or (isinstance(pred, Array) and (pred.shape != () or
                                                                            not isdtype(pred.dtype, "bool"))):
        got = f"{pred.dtype} of shape {pred.shape}" if isinstance(pred, Array) else type(pred).__name__
        raise TypeError(f"fa.lax.while_loop: cond_fun must return a bool or a bool array of shape (), got {got}")
    if _traced(pred):
        raise plan.ConcretizationError(
            "fa.lax.while_loop: cond_fun's result depends on fa.jit's traced or fa.vmap's batched arguments. "
            "flyarray records a loop by unrolling it, so each iteration's predicate needs a value while "
            "recording: use fa.lax.fori_loop with bounds known while tracing, or run the loop outside "
            "fa.jit/fa.vmap.")
    return bool(_value(pred, carry))


def _scan_length(x_leaves, length) -> int:
    if length is not None:
        try:
            n = -1 if isinstance(length, bool) else operator.index(length)   # numpy ints too
        except TypeError:
            n = -1
        if n < 0:
            raise TypeError(f"fa.lax.scan: length must be a non-negative int or None, got {length!r:.60}")
        length = n
    for i, x in enumerate(x_leaves):
        if x.ndim == 0:
            raise ValueError(f"fa.lax.scan: xs leaf {i} is a scalar; each xs leaf needs a leading axis to scan")
    lengths = {x.shape[0] for x in x_leaves}
    if length is not None:
        lengths.add(length)
    if len(lengths) > 1:
        shown = ", ".join(f"leaf {i}: {x.shape}" for i, x in enumerate(x_leaves))
        extra = f"; length={length}" if length is not None else ""
        raise ValueError(f"fa.lax.scan: the xs leaves need one leading length ({shown}{extra})")
    if not lengths:
        raise ValueError("fa.lax.scan: with no xs, pass length")
    return lengths.pop()


def _scan_step(f, carry, x):
    out = f(carry, x)
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError(f"fa.lax.scan: f must return a pair (carry, y), got {type(out).__name__}")
    return _next_carry(out[0], carry, "scan", "f"), _as_arrays(out[1], "scan", "f's y")


def _stack_steps(ys):
    from .ops import stack
    for i, y in enumerate(ys[1:], 1):
        _check_same_types(ys[0], y, "scan", "the first step's y", f"step {i}'s y")
    leaves = [tree_flatten(y)[0] for y in ys]
    return tree_unflatten(tree_flatten(ys[0])[1], [stack(column) for column in zip(*leaves)])


def _empty_stack(y):
    from .ops import zeros
    leaves, treedef = tree_flatten(y)
    return tree_unflatten(treedef, [zeros((0, *x.shape), dtype=x.dtype, device=x.device) for x in leaves])


def _select(pred, on_true, on_false):
    from .ops import where
    t_leaves, treedef = tree_flatten(on_true)
    return tree_unflatten(treedef, [where(pred, t, e) for t, e in zip(t_leaves, tree_flatten(on_false)[0])])
