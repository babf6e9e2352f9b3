"""Progress bars for long work (autotuning, benches): tqdm on a terminal, nothing anywhere else.

A bar goes to stderr only when stderr is a terminal and tqdm is installed (an optional dependency);
in a pipe, a log file, CI or a notebook's captured stream the same calls do nothing, so no carriage
returns end up in logs. Text meant for the user while a bar runs goes through ``bar.write``, which
prints above the bar (tqdm.write) or plainly to stderr.
"""
from __future__ import annotations

import sys


class _Silent:
    """The bar where none is shown: counts nothing, prints only what ``write`` is given."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def write(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class _Bar(_Silent):
    def __init__(self, tqdm, total: int, desc: str, delay: float):
        self._tqdm = tqdm
        self._bar = tqdm(total=total, desc=desc, file=sys.stderr, delay=delay, leave=False, dynamic_ncols=True)

    def update(self, n: int = 1) -> None:
        self._bar.update(n)

    def close(self) -> None:
        self._bar.close()

    def write(self, text: str) -> None:
        self._tqdm.write(text, file=sys.stderr)


def bar(total: int, desc: str, delay: float = 0.0):
    """A progress bar over ``total`` steps (``update()``, ``write(text)``, ``close()``, or ``with``):
    tqdm on stderr when it is a terminal and tqdm is installed, else silent. ``delay``: seconds before
    the bar first appears (work that ends sooner shows nothing)."""
    stream = sys.stderr
    if not (hasattr(stream, "isatty") and stream.isatty()):
        return _Silent()
    try:
        from tqdm import tqdm
    except ImportError:
        return _Silent()
    return _Bar(tqdm, total, desc, delay)
