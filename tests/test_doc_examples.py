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
