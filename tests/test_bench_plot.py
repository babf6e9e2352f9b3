"""python -m flyarray bench --plot: a PNG per run, drawn from the rows; a clear error without matplotlib."""
import sys
from pathlib import Path

import pytest
import torch

from flyarray.bench import harness

pytest.importorskip("matplotlib")

PNG = b"\x89PNG\r\n\x1a\n"


def _tiny_case():
    import flyarray as fa
    x = torch.randn(64)
    return harness.Case("tiny exp", ours=lambda: fa.exp(fa.asarray(x)).torch(), eager=lambda: torch.exp(x),
                        compilable=lambda: torch.exp(x), bytes_moved=2 * x.nbytes)


def test_cli_writes_a_png_and_only_where_asked(tmp_path, monkeypatch):
    from flyarray.__main__ import main
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(harness, "copy_bandwidth", lambda device, small: 1e10)
    monkeypatch.setattr(harness, "SUITES", ["tiny"])
    monkeypatch.setattr(harness, "suite_cases", lambda suite, device, small: [_tiny_case()])
    run_case = harness.run_case  # quick: no torch.compile, two calls a repeat (seconds, not minutes)
    monkeypatch.setattr(harness, "run_case", lambda case, device, bandwidth: run_case(
        case, device, bandwidth, compile=False, host_iters=2, repeats=1))
    out = tmp_path / "bench.png"
    assert main(["bench", "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.png"]  # no bench.json without --json


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_cli_checks_its_output_paths_before_the_run(tmp_path, monkeypatch, flag):
    """A file that cannot be written fails at once (--json failed after the first row's timing)."""
    from flyarray.__main__ import main
    monkeypatch.setattr(harness, "run", lambda *a, **k: pytest.fail("ran before checking the path"))
    for path, why in ((str(tmp_path / "missing" / "out"), "does not exist"), ("", "expected a file path"),
                      (str(tmp_path), "expected a file path")):
        with pytest.raises(SystemExit, match=why):
            main(["bench", flag, path])


def test_plot_draws_rows_with_missing_values_and_failures(tmp_path):
    from flyarray.bench.plot import plot
    rows = [{"name": "all three", "status": "ok", "ours_ms": 0.01, "eager_ms": 0.02, "compile_ms": 0.005},
            {"name": "no compile", "status": "ok", "ours_ms": 0.01, "eager_ms": 0.02, "compile_ms": None},
            {"name": "broken", "status": "WRONG (rel error 1 > 0.01)"},
            {"name": "  probe", "status": "ok", "ours_ms": 1.0}]
    path = plot(rows, str(tmp_path / "p.png"))
    data = Path(path).read_bytes()
    assert data[:8] == PNG and len(data) > 5000
    assert plot([], str(tmp_path / "empty.png")) and (tmp_path / "empty.png").read_bytes()[:8] == PNG


def test_missing_matplotlib_is_a_clear_error(monkeypatch):
    from flyarray.bench import plot
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(ImportError, match="pip install matplotlib"):
        plot.require()


def test_cli_refuses_what_it_cannot_write_before_the_run(tmp_path, monkeypatch):
    """An existing read-only --json file, a --plot suffix matplotlib cannot draw, and a missing matplotlib were
    found only after the timing (tracebacks; a helper's round of the tooling, thirty-sixth session)."""
    import os
    from flyarray.__main__ import main
    monkeypatch.setattr(harness, "run", lambda *a, **k: pytest.fail("ran before checking the outputs"))
    locked = tmp_path / "locked.json"
    locked.write_text("{}")
    monkeypatch.setattr(os, "access", lambda path, mode: str(path) != str(locked))
    with pytest.raises(SystemExit, match="--json: cannot write"):
        main(["bench", "--json", str(locked)])
    monkeypatch.undo()
    monkeypatch.setattr(harness, "run", lambda *a, **k: pytest.fail("ran before checking the outputs"))
    with pytest.raises(SystemExit, match="--plot: matplotlib cannot write 'table'"):
        main(["bench", "--plot", str(tmp_path / "out.table")])
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(SystemExit, match="--plot: .*pip install matplotlib"):
        main(["bench", "--plot", str(tmp_path / "out.png")])


def test_info_names_a_bad_setting_without_a_traceback(monkeypatch, capsys):
    from flyarray import runtime
    from flyarray.__main__ import main
    monkeypatch.setenv("FLYARRAY_BACKEND", "cuda")
    monkeypatch.setattr(runtime, "_backend_override", None)
    monkeypatch.setattr(runtime, "_env_backend", None)   # read once a process: read again here
    with pytest.raises(SystemExit, match="info: FLYARRAY_BACKEND='cuda'; choose one of"):
        main(["info"])


def test_the_report_reader_refuses_what_is_not_a_report(tmp_path, capsys):
    """python -m flyarray.bench.harness took --help as a file and ended in tracebacks on bad files."""
    bad = {"list.json": "[]", "foreign.json": '{"foo": 1}', "corrupt.json": "{", "rowless.json": '{"rows": [{}]}'}
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(SystemExit) as exit_:
            harness._main([str(tmp_path / name)])
        assert exit_.value.code == 2
        assert name in capsys.readouterr().err
    with pytest.raises(SystemExit):
        harness._main([])
    with pytest.raises(SystemExit) as help_:
        harness._main(["--help"])
    assert help_.value.code == 0 and "REPORT.json" in capsys.readouterr().out
