"""``python -m flyarray bench --plot FILE.png``: flyarray beside torch eager and torch.compile, per row.

One line per benchmark row with a marker per contender (microseconds per call on a log scale, left is
faster; markers, not bars, because a bar's length on a log axis means nothing),
drawn with matplotlib's Agg backend (no display needed). matplotlib is optional: ``require()`` says
how to install it, and the CLI calls it before running anything, so a missing package fails at once.
"""
from __future__ import annotations

SERIES = [("flyarray", "ours_ms", "#d62728", "o"), ("torch eager", "eager_ms", "#1f77b4", "s"),
          ("torch.compile", "compile_ms", "#2ca02c", "^")]


def require():
    """matplotlib, or an ImportError that says how to get it."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError("python -m flyarray bench --plot needs matplotlib: pip install matplotlib "
                          "(or pip install -e '.[plot]')") from exc
    matplotlib.use("Agg")  # a file, never a window: works on a headless machine
    return matplotlib


def plot(rows: list, path: str, title: str = "") -> str:
    """Draw ``rows`` (the harness's row dicts) to ``path`` (the format from its suffix, e.g. .png).
    A missing value draws no marker; a row that failed its check is labelled with its status."""
    require()
    import matplotlib.pyplot as plt
    rows = [r for r in rows if not r["name"].startswith(" ")]  # config probes are not rows a reader wants
    fig, ax = plt.subplots(figsize=(10, 1.5 + 0.3 * max(len(rows), 1)))
    for label, key, color, marker in SERIES:
        ys, xs = [], []
        for i, row in enumerate(rows):
            value = row.get(key)
            if isinstance(value, (int, float)) and value > 0:
                ys.append(i)
                xs.append(value * 1e3)
        ax.scatter(xs, ys, color=color, marker=marker, label=label, zorder=3)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([_label(r) for r in rows], fontsize=8)
    ax.set_ylim(max(len(rows), 1) - 0.5, -0.5)  # the first row on top, as the table prints it
    ax.grid(axis="y", color="#dddddd", zorder=0)
    if any(r.get(k) for r in rows for _, k, _, _ in SERIES):
        ax.set_xscale("log")
    ax.set_xlabel("microseconds per call (log scale; left is faster)")
    ax.set_title(title or "flyarray vs torch eager vs torch.compile")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    if not rows:
        ax.text(0.5, 0.5, "no rows", transform=ax.transAxes, ha="center")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _label(row: dict) -> str:
    name = row["name"][:48]
    return name if row.get("status", "ok") == "ok" else f"{name} [{row['status'][:30]}]"
