"""Draw the docs' front-page diagram of a DP-Hype run (docs/flow.svg): voters, tallies, winner, training, evaluation.

Run from the repository root: ``python docs/flow_diagram.py`` rewrites ``docs/flow.svg`` (``--png FILE`` also writes
a PNG, to look at it). The SVG keeps its text as text and carries no date, so the same code writes the same file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

#: Where the site's front page (docs/index.md) finds the diagram.
OUT = Path(__file__).resolve().parent / "flow.svg"

#: The stages: (x, y) centre in axes units, title, lines below it, fill colour.
STAGES = {
    "server": ((0.10, 0.70), "Server", ["public candidates", "epsilon, delta, k", "calibrated noise"], "#dbe8f6"),
    "voters": ((0.36, 0.70), "Voters (n nodes)", ["score every candidate", "on their own data,",
                                                  "check policy + ledger,", "cast a ballot"], "#e3f1df"),
    "tallies": ((0.63, 0.70), "3 tallies (MPC)", ["check every ballot,", "sample the noise jointly,",
                                                  "open only the winner"], "#fbead3"),
    "winner": ((0.89, 0.70), "Winner", ["its index only:", "epsilon-DP, in every", "node's ledger"], "#f6dada"),
    "training": ((0.63, 0.20), "Final training", ["FedAvg on the voters", "with the winner (or",
                                                  "DP-FedAvg: one", "composed guarantee)"], "#e3f1df"),
    "evaluation": ((0.36, 0.20), "Evaluation", ["the final model's", "accuracy, against the", "majority baseline"],
                   "#dbe8f6"),
    "result": ((0.10, 0.20), "Result", ["pick, guarantee,", "model and accuracy", "in the run's record"], "#eeeeee"),
}
#: The arrows: (from, to, label).
FLOWS = [
    ("server", "voters", "vote\nrequest"),
    ("voters", "tallies", "sealed\nshares"),
    ("tallies", "winner", "noisy\nargmax"),
    ("winner", "training", "the winner's\nhyperparameters"),
    ("training", "evaluation", "model"),
    ("evaluation", "result", ""),
]
WIDTH, HEIGHT = 0.175, 0.34


def draw() -> plt.Figure:
    """The diagram as a matplotlib figure."""
    fig, ax = plt.subplots(figsize=(12.0, 4.6))
    ax.set_xlim(-0.01, 1.01)
    ax.set_ylim(0, 1)
    ax.axis("off")
    for (x, y), title, lines, colour in STAGES.values():
        ax.add_patch(FancyBboxPatch((x - WIDTH / 2, y - HEIGHT / 2), WIDTH, HEIGHT, boxstyle="round,pad=0.01",
                                    facecolor=colour, edgecolor="#444444", linewidth=1.2))
        ax.text(x, y + HEIGHT / 2 - 0.06, title, ha="center", va="center", fontsize=12, fontweight="bold")
        ax.text(x, y - 0.04, "\n".join(lines), ha="center", va="center", fontsize=9.5, linespacing=1.35)
    for source, target, label in FLOWS:
        (x0, y0), (x1, y1) = STAGES[source][0], STAGES[target][0]
        if y0 == y1:  # along a row: from edge to edge
            sign = 1 if x1 > x0 else -1
            start, end = (x0 + sign * WIDTH / 2, y0), (x1 - sign * WIDTH / 2, y1)
            where, align = ((x0 + x1) / 2, y0 + 0.025), "bottom"
        else:  # down to the next row
            start, end = (x0, y0 - HEIGHT / 2 - 0.01), (x1 + WIDTH / 2 + 0.01, y1)
            where, align = (x0 + 0.01, (y0 + y1) / 2 + 0.02), "center"
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=16, linewidth=1.4, color="#333333",
                                     connectionstyle="arc3,rad=0" if y0 == y1 else "angle,angleA=-90,angleB=0"))
        if label:
            ax.text(*where, label, ha="center" if y0 == y1 else "left", va=align, fontsize=9, style="italic")
    ax.text(0.5, 0.98, "A DP-Hype run (default release: only the winner's index leaves the tally committee; "
            "release=\"sum\": the voters' noisy vote sum over SecAgg+ instead)", ha="center", va="top", fontsize=10)
    return fig


def main() -> None:
    """Write docs/flow.svg, and a PNG with ``--png FILE``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--png", type=Path, default=None, help="also write a PNG here")
    args = parser.parse_args()
    plt.rcParams["svg.fonttype"] = "none"  # text stays text
    plt.rcParams["svg.hashsalt"] = "dphype-flow"  # the same ids on every run
    fig = draw()
    fig.savefig(OUT, format="svg", bbox_inches="tight", metadata={"Date": None})
    if args.png is not None:
        fig.savefig(args.png, dpi=110, bbox_inches="tight")


if __name__ == "__main__":
    main()
