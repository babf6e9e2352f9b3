"""Every public callable of fa, fa.linalg, fa.fft, fa.nn, fa.quant, fa.random, fa.tree_util, fa.lax and fa.Array has a docstring."""
import inspect
import types

import flyarray as fa

MIN_LEN = 20


def _is_dtype(obj):
    return isinstance(obj, fa.DType)


def _public(namespace):
    """(qualified name, object) for each public function or class that ``namespace`` exposes."""
    for name in sorted(getattr(namespace, "__all__", None) or dir(namespace)):   # __all__: what it exports
        if name.startswith("_"):
            continue
        obj = getattr(namespace, name)
        if isinstance(obj, types.ModuleType) or _is_dtype(obj):
            continue
        if not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj) or callable(obj)):
            continue
        if not getattr(obj, "__module__", "").startswith("flyarray"):
            continue  # a re-exported third-party name (typing, torch, ...)
        yield name, obj


def _array_members():
    for name, obj in sorted(vars(fa.Array).items()):
        if name.startswith("_"):
            continue
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        if isinstance(obj, property) or inspect.isfunction(obj) or callable(obj):
            yield name, obj


def _missing():
    found = []
    for prefix, namespace in [("fa", fa), ("fa.linalg", fa.linalg), ("fa.fft", fa.fft), ("fa.nn", fa.nn), ("fa.quant", fa.quant),
                              ("fa.random", fa.random), ("fa.tree_util", fa.tree_util), ("fa.lax", fa.lax)]:
        for name, obj in _public(namespace):
            found.append((f"{prefix}.{name}", obj))
    found += [(f"fa.Array.{name}", obj) for name, obj in _array_members()]
    bad = []
    for qualname, obj in found:
        doc = inspect.getdoc(obj) if not isinstance(obj, property) else obj.__doc__
        if not doc or len(doc.strip()) < MIN_LEN:
            bad.append(qualname)
    return found, bad


def test_walk_finds_the_api():
    found, _ = _missing()
    names = {n for n, _ in found}
    for expected in ("fa.exp", "fa.add", "fa.asarray", "fa.nn.softmax", "fa.random.normal", "fa.Array.shape",
                     "fa.tree_util.tree_map", "fa.jit"):
        assert expected in names, expected


def test_every_public_callable_has_a_docstring():
    _, bad = _missing()
    assert not bad, f"{len(bad)} public callables without a docstring of at least {MIN_LEN} characters:\n  " + \
        "\n  ".join(bad)
