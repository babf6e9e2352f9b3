"""Progress bars: tqdm on a terminal, nothing on a non-terminal (pipes, CI logs), nothing without tqdm."""
import io
import sys

import pytest

from flyarray import progress


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _run(n=3):
    with progress.bar(n, "tuning k") as bar:
        for _ in range(n):
            bar.update()


def test_a_terminal_gets_a_bar(monkeypatch):
    pytest.importorskip("tqdm")
    err = _Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    _run()
    assert "tuning k" in err.getvalue() and "/3 [" in err.getvalue()  # leave=False: cleared when done


def test_a_non_terminal_gets_nothing(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    _run()
    assert err.getvalue() == ""
    progress.bar(2, "x").write("a row")  # text meant for the user still arrives, plainly
    assert err.getvalue() == "a row\n"


def test_no_tqdm_gets_nothing(monkeypatch):
    err = _Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setitem(sys.modules, "tqdm", None)
    _run()
    assert err.getvalue() == ""


def test_bench_rows_still_print_through_the_bar(monkeypatch, capsys):
    import torch

    from flyarray.bench import harness
    monkeypatch.setattr(harness, "copy_bandwidth", lambda device, small: 1e10)
    x = torch.randn(8)
    case = harness.Case("negate", ours=lambda: -x, eager=lambda: -x)
    monkeypatch.setattr(harness, "suite_cases", lambda suite, device, small: [case, case])
    run_case = harness.run_case
    monkeypatch.setattr(harness, "run_case", lambda c, d, b: run_case(c, d, b, compile=False, host_iters=2, repeats=1))
    rows = harness.run(["s"])
    err = capsys.readouterr().err
    assert len(rows) == 2 and err.count("negate") == 2 and "\r" not in err  # not a terminal: no bar


def test_autotuning_reports_each_candidate(monkeypatch, tmp_path):
    import torch

    from flyarray.kernels import tuning
    monkeypatch.setenv("FLYARRAY_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tuning, "_memory", {})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(tuning, "time_config", lambda run, cfg: cfg["ms"])  # no device: fake timings
    seen = []

    class Recorder(progress._Silent):
        def __init__(self, total, desc, delay=0.0):
            seen.append([total, desc, 0])

        def update(self, n=1):
            seen[-1][2] += n
    monkeypatch.setattr(progress, "bar", Recorder)
    candidates = [{"ms": 3.0}, {"ms": 1.0}, {"ms": 2.0}]
    assert tuning.tune("k", "k|sm_90|x", candidates, run=None, default=candidates[0]) == {"ms": 1.0}
    assert seen == [[3, "tuning k|sm_90|x", 3]]
