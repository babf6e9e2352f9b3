"""python -m flyarray bench | info"""
from __future__ import annotations

import argparse
import sys


def _info() -> dict:
    import torch
    import triton

    import flyarray
    from flyarray import config, runtime
    from flyarray.targets import TARGETS
    device = runtime.default_device()
    info = {
        "flyarray": flyarray.__version__,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "triton": triton.__version__,
        "backend": runtime.backend_for(device),
        "device": str(device),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "cross_compile_targets": sorted(TARGETS),
        "cache_dir": str(config.cache_dir()),
    }
    return info


def _bench_distributed(args) -> int:
    """The distributed suite has its own runner: every rank times the same calls; rank 0 prints."""
    if args.suite != ["distributed"] or args.plot:
        raise SystemExit("--suite distributed runs alone (no other suites, no --plot)")
    from flyarray.bench.distributed import run
    rows = run(small=True if args.small else None, json_path=args.json)
    return 1 if any(r["status"] != "ok" for r in rows) else 0


def _check_output_path(path, flag: str) -> None:
    """An output file named on the command line can be written: checked before the run, not after minutes of
    timing. Exits with the reason otherwise."""
    import os
    if path is None:
        return
    if not path or os.path.isdir(path):
        raise SystemExit(f"{flag}: expected a file path, got {path!r}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise SystemExit(f"{flag}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise SystemExit(f"{flag}: cannot write in {folder}")
    if os.path.exists(path) and not os.access(path, os.W_OK):   # (an existing file of its own mode)
        raise SystemExit(f"{flag}: cannot write {path}")


def _check_plot_format(path) -> None:
    """matplotlib is there and draws ``path``'s format (its suffix): before the run, not after the timing."""
    import os
    from flyarray.bench.plot import require
    try:
        matplotlib = require()
    except ImportError as exc:
        raise SystemExit(f"--plot: {exc}") from None
    import matplotlib.figure
    formats = matplotlib.figure.Figure().canvas.get_supported_filetypes()
    suffix = os.path.splitext(path)[1].lstrip(".").lower()
    if suffix not in formats:
        raise SystemExit(f"--plot: matplotlib cannot write {suffix or 'a file without a suffix'!r}; use one of "
                         f"{', '.join(sorted(formats))}")


def _suite_names() -> list:
    from flyarray.bench.harness import SUITES
    return SUITES + ["distributed"]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m flyarray")
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="compare flyarray with torch eager and torch.compile")
    bench.add_argument("--suite", action="append", choices=_suite_names(), metavar="SUITE",
                       help="only these suites (elementwise, norms, topk, gemm, attention, mx, overhead, training, torch; "
                            "distributed, alone, under torchrun: docs/distributed.md); repeatable")
    bench.add_argument("--json", default=None, metavar="PATH",
                       help="write the results as JSON to PATH (default: no file)")
    bench.add_argument("--small", action="store_true", help="small shapes even on a GPU")
    bench.add_argument("--plot", default=None, metavar="FILE.png",
                       help="also draw flyarray, torch eager and torch.compile per row to FILE (needs matplotlib)")
    sub.add_parser("info", help="versions, backend, device, targets, cache dir")
    args = parser.parse_args(argv)
    if args.command == "info":
        try:
            info = _info()
        except ValueError as exc:   # a setting it reads (FLYARRAY_BACKEND=cuda): the reason, not a traceback
            raise SystemExit(f"python -m flyarray info: {exc}") from None
        for k, v in info.items():
            print(f"{k:22} {v}")
        return 0
    _check_output_path(args.json, "--json")
    _check_output_path(args.plot, "--plot")
    if args.suite and "distributed" in args.suite:
        return _bench_distributed(args)
    from flyarray.bench.harness import run
    if args.plot:
        _check_plot_format(args.plot)  # before the run: a missing matplotlib fails now, not after minutes of timing
    rows = run(args.suite, small=True if args.small else None, json_path=args.json)
    if args.json:
        print(f"\nwrote {args.json}")
    if args.plot:
        from flyarray.bench.plot import plot
        print(f"wrote {plot(rows, args.plot)}")
    bad = [r for r in rows if r["status"] != "ok"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
