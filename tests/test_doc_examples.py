"""The worked examples in docs/ run as written (so the docs cannot rot)."""
import pathlib
import re

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"


def _python_block(page: str, heading: str) -> str:
    text = (DOCS / page).read_text()
    section = text[text.index(heading):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_transforms_worked_example_trains_from_a_random_key(capsys):
    code = _python_block("transforms.md", "## Worked example")
    scope = {}
    exec(compile(code, "docs/transforms.md", "exec"), scope)
    assert float(scope["l"]) < 1e-3
    w = scope["np"].asarray(scope["params"]["w"]).ravel()
    assert abs(w[0] - 2.0) < 0.01 and abs(w[1] + 1.0) < 0.01 and abs(w[2] - 0.5) < 0.01


def test_torch_worked_example_trains_through_the_backend():
    import torch
    code = _python_block("torch.md", "## Worked example")
    scope = {}
    torch._dynamo.reset()
    exec(compile(code, "docs/torch.md", "exec"), scope)
    model, x = scope["model"], scope["x"]
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x.detach()).square().mean().backward()
    for got, p in zip(grads, model.parameters()):
        torch.testing.assert_close(got, p.grad)
    torch.testing.assert_close(scope["out"], torch.exp(scope["y"]) * 2.0)


def test_transforms_composition_example_agrees():
    import numpy as np
    code = _python_block("transforms.md", "## Composing transforms")
    scope = {}
    exec(compile(code, "docs/transforms.md", "exec"), scope)
    np.testing.assert_allclose(np.asarray(scope["per_row_grads"]), np.asarray(scope["same"]), rtol=1e-6)
    assert scope["per_row"].shape == (5,) and scope["hess"].shape == (4, 4)


def test_control_flow_example_computes_what_it_says():
    import numpy as np
    code = _python_block("transforms.md", "## Control flow")
    scope = {}
    exec(compile(code, "docs/transforms.md", "exec"), scope)
    xs = np.arange(12.0).reshape(4, 3)
    ema, trail = np.zeros(3), []
    for x in xs:
        trail.append(ema)
        ema = 0.9 * ema + 0.1 * x
    np.testing.assert_allclose(np.asarray(scope["ema"]), ema, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(scope["trail"]), np.stack(trail), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(scope["power"]), np.prod(xs[[0, 1, 2, 3, 0]], axis=0), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(scope["halved"]), xs[3] / 16)
    fa = scope["fa"]
    np.testing.assert_allclose(np.asarray(scope["sign"](fa.asarray(-1.0), fa.asarray(xs[1].astype(np.float32)))), -xs[1])
    np.testing.assert_allclose(np.asarray(scope["grads"]), [20.0, 15.0, 12.0], rtol=1e-6)
