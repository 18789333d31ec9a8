"""A run's learning curve: per-step mean return as CSV (``step,mean_return``) and a PNG plot
beside it (matplotlib, the ``bench`` and ``test`` extras)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = ["write_curve"]


def write_curve(path: Path, returns: Sequence[float], title: str) -> Path:
    """Write ``path`` (CSV, one line per step, 1-based) and the plot ``path`` with suffix
    ``.png``; returns the plot's path."""
    lines = ["step,mean_return"] + [f"{i},{r:.6g}" for i, r in enumerate(returns, start=1)]
    path.write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot(range(1, len(returns) + 1), returns, marker=".")
    ax.set_xlabel("training step (GRPO update)")
    ax.set_ylabel("mean episode return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    png = path.with_suffix(".png")
    fig.savefig(png)
    plt.close(fig)
    return png
