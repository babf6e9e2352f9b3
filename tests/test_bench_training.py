"""The training suite on the CPU at its tiny sizes: the row runs, and a flyarray training loop gives
torch's losses and parameters step after step. No timing thresholds (a shared machine must not fail
a test); the numbers come from ``python -m flyarray bench --suite training``."""
import pytest
import torch

import flyarray as fa
from flyarray.bench import harness, training

CPU = torch.device("cpu")


def test_suite_is_registered_and_its_row_is_correct():
    assert "training" in harness.SUITES
    cases = harness.suite_cases("training", CPU, small=True)
    assert len(cases) == 1
    case = cases[0]
    assert case.timing == "host" and case.flops == training.flops(**training.CPU_SIZES)
    row = harness.run_case(case, CPU, bandwidth=None, compile=False, host_iters=2, repeats=1)
    assert row["status"] == "ok", row
    assert row["rel_error"] <= 1e-3
    assert row["ours_ms"] > 0 and row["eager_ms"] > 0 and row["ours_TFLOPs"] > 0
    assert row["compile_ms"] is None  # compile=False


def _loops(lr_fa=training.LR, lr_torch=training.LR, steps=1):
    params, x, y = training.init(**training.CPU_SIZES, dtype=torch.float32, device=CPU, seed=1)
    return params, training.fa_loop(params, x, y, lr=lr_fa), training.torch_loop(params, x, y, lr=lr_torch)


def test_a_training_loop_follows_torch_and_carries_its_state():
    params, ours, eager = _loops()
    check = training.make_check(params, fp32=True)
    losses = []
    for i in range(8):
        out, ref = ours(), eager()
        assert all(isinstance(t, torch.Tensor) for t in out)
        if i == 0:
            assert check(out, ref) <= 1e-4
        torch.testing.assert_close(out[0], ref[0], rtol=1e-4, atol=1e-6)
        for a, b in zip(out[1:], ref[1:]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        losses.append(float(out[0]))
    assert losses[-1] < losses[0]  # the state is carried: it trains
    assert len(set(losses)) == len(losses)


def test_the_step_is_traced_once():
    params, x, y = training.init(**training.CPU_SIZES, dtype=torch.float32, device=CPU)
    step = training.make_fa_step()
    for _ in range(3):
        loss, params = step(params, x, y)
        assert type(params) is list and all(type(p) is training.Linear for p in params)
        params = fa.tree_util.tree_map(lambda a: a.torch(), params)
    assert len(step.cache) == 1


def test_the_check_catches_a_wrong_update():
    params, ours, eager = _loops(lr_fa=2 * training.LR)
    err = training.make_check(params, fp32=True)(ours(), eager())
    assert err > 0.1


@pytest.mark.parametrize("suite", ["bogus", "Elementwise", "plot"])
def test_an_unknown_suite_is_a_usage_error_naming_the_suites(suite, capsys):
    from flyarray.__main__ import main
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--suite", suite])
    assert exit_info.value.code == 2
    assert f"invalid choice: '{suite}'" in capsys.readouterr().err
