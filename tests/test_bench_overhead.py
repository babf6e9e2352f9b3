"""The overhead suite on the CPU with tiny iteration counts: the rows exist and their results are right.

No timing thresholds (a shared machine must not fail a test); the numbers come from
``python -m flyarray bench --suite overhead``.
"""
import json

import pytest
import torch

from flyarray.bench import harness, overhead

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def rows():
    assert "overhead" in harness.SUITES
    cases = harness.suite_cases("overhead", CPU, small=True)
    return [harness.run_case(c, CPU, bandwidth=None, compile=False, host_iters=2, repeats=1) for c in cases]


def test_rows_exist_and_are_correct(rows):
    names = [r["name"] for r in rows]
    expected = ["exp(x)+1 2048", "rms_norm 8x1024 f32 [user path]", "from_dlpack(realized array)",
                "from_dlpack(asarray(t)), no op", "fa.jit sin*x+1", "30-op chain 4096 f32 fa.jit",
                "30-op chain 4096 f32 lazy"]
    for prefix in expected:
        assert any(n.startswith(prefix) for n in names), (prefix, names)
    if hasattr(torch.nn.functional, "rms_norm"):
        assert any("vs F.rms_norm" in n for n in names)
    if overhead._way_out() is not None:
        assert any("(realized) vs from_dlpack" in n for n in names)
    for r in rows:
        assert r["status"] == "ok", r
        assert r["timing"] == "host"
        assert r["ours_ms"] > 0 and r["eager_ms"] > 0
        assert r["ours_over_eager"] == pytest.approx(r["ours_ms"] / r["eager_ms"])
        assert r["compile_ms"] is None  # compile=False
        assert r.get("ours_device_ms") is None  # no device column on the CPU
        assert r["cpu_threads"] == 1


def test_user_path_results_are_torch_tensors():
    for case in harness.suite_cases("overhead", CPU, small=True):
        assert isinstance(case.ours(), torch.Tensor), case.name


def test_chain30_has_thirty_ops():
    class Count:
        n = 0

        def __getattr__(self, name):
            def op(x):
                Count.n += 1
                return x
            return op

    class Num(float):  # counts every arithmetic op with a number
        def _op(self, other):
            Count.n += 1
            return self
        __mul__ = __add__ = __sub__ = __rmul__ = __radd__ = __rsub__ = _op

    overhead.chain30(Num(1.0), Count())
    assert Count.n == 30


def test_table_stays_aligned_with_missing_values():
    full = {"name": "a", "status": "ok", "goal": "g", **{key: 1.5e-3 for _, key, _, _ in harness.COLUMNS}}
    sparse = {"name": "b" * 80, "status": "ERROR: boom"}
    huge = {"name": "c", "status": "ok", "ours_ms": 1e9, "ours_over_eager": float("inf")}
    lines = harness.format_table([full, sparse, huge]).splitlines()
    status_at = [line.index("  ok") if "  ok" in line else line.index("  ERROR") for line in lines[2:]]
    assert len(set(status_at)) == 1, lines
    assert lines[0].index("status") == status_at[0] + 2
    assert " - " in lines[3]


def test_json_only_where_asked(tmp_path, monkeypatch):
    from flyarray.__main__ import main
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(harness, "copy_bandwidth", lambda device, small: 1e10)
    monkeypatch.setattr(harness, "SUITES", ["no_such_suite"])
    assert main(["bench"]) == 0
    assert list(tmp_path.iterdir()) == []
    assert main(["bench", "--json", str(tmp_path / "out.json")]) == 0
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["rows"] == [] and "environment" in report


def test_summary_of_a_saved_report(rows):
    report = {"environment": {"device": "cpu", "torch": "x", "triton": "y"}, "copy_GBps": 1.0,
              "rows": [{**r, "suite": "overhead"} for r in rows] + [{"name": "  probe", "status": "ok"}]}
    lines = harness.summary(report).splitlines()
    assert len(lines) == 3 + len(rows)  # environment, header, rule; probes left out
    assert all(line.startswith("overhead") for line in lines[3:])
