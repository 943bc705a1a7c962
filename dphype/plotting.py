"""Figures for dphype's reports and benchmarks: matplotlib on the non-interactive Agg backend.

matplotlib is imported on first use only, so importing dphype stays light.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """``matplotlib.pyplot`` with the Agg backend (no display needed)."""
    # lazy import: matplotlib
    import matplotlib

    matplotlib.use("Agg")
    # lazy import: matplotlib
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | Path, *, dpi: int = 100) -> str:
    """Save ``fig`` as a PNG at ``path`` (creating its folder) and close it.

    Args:
        fig: A matplotlib figure.
        path: The PNG file to write.
        dpi: Its resolution in dots per inch.

    Returns:
        ``path``, as a string.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=dpi, bbox_inches="tight")
    pyplot().close(fig)
    return str(target)
