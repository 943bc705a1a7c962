"""Privacy-utility Pareto fronts: non-dominated sets, hypervolumes and plots.

Objectives are ``(epsilon, error)`` pairs, both minimised, as in DPareto (Avent et al.,
PoPETs 2020, Sec. 2 and Sec. 3.1). Dominance follows DPareto Def. 2; the hypervolume
``HV_{v+}(P)`` is the Lebesgue measure of the region dominated by the front ``P`` and
bounded by the anti-ideal point ``v+`` (default ``(10, 1)``, DPareto Sec. 4.1).

BoTorch provides the non-dominated filter and the general hypervolume (it maximises, so
points are negated). The hypervolume *improvement* of many candidate points at once, which
DPareto's HVPoI acquisition (Eq. 3) needs for every point of a candidate pool, is a
vectorised 2-D staircase integral written here (BoTorch has no batched 2-D version).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from dphype.plotting import pyplot, save_figure

#: DPareto's anti-ideal point (epsilon, classification error), Sec. 4.1.
DEFAULT_REFERENCE: tuple[float, float] = (10.0, 1.0)


def _points(points: np.ndarray | Sequence[Sequence[float]], name: str = "points") -> np.ndarray:
    """Validate an ``(n, 2)`` array of (epsilon, error) points (NaN is an error)."""
    arr = np.asarray(points, dtype=np.float64)
    if arr.ndim == 1 and arr.size == 0:
        arr = arr.reshape(0, 2)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise ValueError(f"{name} must have shape (n, 2) of (epsilon, error) pairs, got {arr.shape}")
    if np.isnan(arr).any():
        raise ValueError(f"{name} must not contain NaN")
    return arr


def _reference(reference: Sequence[float] | np.ndarray, *, allow_inf: bool = False) -> np.ndarray:
    ref = np.asarray(reference, dtype=np.float64)
    ok = ref.shape == (2,) and not np.isnan(ref).any() and (np.isfinite(ref).all() or allow_inf)
    if not ok or (ref == -np.inf).any():
        kind = "numbers or +inf" if allow_inf else "finite numbers"
        raise ValueError(f"reference must be two {kind} (epsilon, error), got {reference!r}")
    return ref


def non_dominated(points: np.ndarray | Sequence[Sequence[float]]) -> np.ndarray:
    """``(n,)`` mask of the points on the front (Def. 2, minimisation); of identical ones only the first is kept."""
    # lazy import: BoTorch; torch
    import torch
    from botorch.utils.multi_objective.pareto import is_non_dominated

    arr = _points(points)
    if len(arr) == 0:
        return np.zeros(0, dtype=bool)
    mask = is_non_dominated(torch.from_numpy(arr), maximize=False, deduplicate=True)
    return mask.numpy()


def pareto_front(points: np.ndarray | Sequence[Sequence[float]]) -> np.ndarray:
    """The ``(m, 2)`` non-dominated points sorted by increasing epsilon (so by decreasing error)."""
    arr = _points(points)
    front = arr[non_dominated(arr)]
    return front[np.argsort(front[:, 0], kind="stable")]


def hypervolume(
    points: np.ndarray | Sequence[Sequence[float]],
    reference: Sequence[float] = DEFAULT_REFERENCE,
) -> float:
    """``HV_{v+}(PF(points))``: area the front dominates in the anti-ideal box (BoTorch's ``DominatedPartitioning``)."""
    # lazy import: BoTorch; torch
    import torch
    from botorch.utils.multi_objective.box_decompositions.dominated import DominatedPartitioning

    arr = _points(points)
    ref = _reference(reference)
    inside = arr[(arr < ref).all(axis=1)]
    if len(inside) == 0:
        return 0.0
    partitioning = DominatedPartitioning(
        ref_point=-torch.from_numpy(ref), Y=-torch.from_numpy(inside)
    )
    return float(partitioning.compute_hypervolume())


def staircase(
    front: np.ndarray, reference: Sequence[float] | np.ndarray = DEFAULT_REFERENCE
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Segments ``[lo_j, hi_j)`` on the epsilon axis and the front's error level ``h_j`` there.

    ``h(x) = min{error(p) : p in front, epsilon(p) <= x}`` (the reference error where no
    point qualifies) is the lower boundary of the dominated region; the last segment ends at
    the reference epsilon. Points outside the box are dropped.

    Args:
        front: ``(m, 2)`` non-dominated (epsilon, error) points.
        reference: The anti-ideal point; it may be ``+inf`` (an unbounded box).

    Returns:
        ``(lo, hi, h)``: the segments' ends and the error levels, each of shape ``(s,)``.

    Raises:
        ValueError: ``front`` or ``reference`` is malformed.
    """  # noqa: DOC502
    ref = _reference(reference, allow_inf=True)
    pts = _points(front, "front")
    pts = pts[(pts < ref).all(axis=1)]
    pts = pts[np.argsort(pts[:, 0], kind="stable")]
    lo = np.concatenate([[-np.inf], pts[:, 0]])
    hi = np.concatenate([pts[:, 0], [ref[0]]])
    level = np.concatenate([[ref[1]], np.minimum.accumulate(pts[:, 1]) if len(pts) else []])
    return lo, hi, level


def hypervolume_improvement(
    front: np.ndarray | Sequence[Sequence[float]],
    candidates: np.ndarray | Sequence[Sequence[float]],
    reference: Sequence[float] = DEFAULT_REFERENCE,
) -> np.ndarray:
    """``Delta_PF(v) = HV(PF(V u {v})) - HV(PF(V))`` for every candidate ``v`` at once.

    DPareto Sec. 3.1 (the factor weighting HVPoI, Eq. 3). For a candidate ``(a, b)`` this is
    ``integral_a^{ref_eps} max(0, min(h(x), ref_err) - b) dx`` over the staircase ``h`` of
    the current front, evaluated segment-wise in one broadcast operation.

    Args:
        front: ``(m, 2)`` (epsilon, error) points of the current front.
        candidates: ``(c, 2)`` candidate points.
        reference: The anti-ideal point.

    Returns:
        The ``(c,)`` improvements.

    Raises:
        ValueError: An input is malformed.
    """  # noqa: DOC502
    return _improvement(pareto_front(front), _points(candidates, "candidates"), reference)


def _improvement(front: np.ndarray, cand: np.ndarray, reference: Sequence[float] | np.ndarray) -> np.ndarray:
    """`hypervolume_improvement` for a ``front`` that is already non-dominated."""
    lo, hi, level = staircase(front, reference)
    a = cand[:, :1]
    b = cand[:, 1:]
    width = np.clip(hi[None, :] - np.maximum(lo[None, :], a), 0.0, None)
    height = np.clip(level[None, :] - b, 0.0, None)
    return (width * height).sum(axis=1)


def hypervolume_trace(
    points: np.ndarray | Sequence[Sequence[float]],
    reference: Sequence[float] = DEFAULT_REFERENCE,
) -> np.ndarray:
    """``(n,)`` hypervolumes of the first ``t`` points, ``t = 1..n``, accumulated over the running front."""
    arr = _points(points)
    ref = _reference(reference)
    trace = np.zeros(len(arr))
    front = np.zeros((0, 2))
    total = 0.0
    for t, p in enumerate(arr):
        total += float(_improvement(front, p[None, :], ref)[0])
        trace[t] = total
        if not (front <= p).all(axis=1).any():
            front = np.vstack([front[~(p <= front).all(axis=1)], p])
    return trace


def _step_xy(front: np.ndarray, reference: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x/y arrays drawing the front's staircase from its first point to the reference epsilon."""
    lo, hi, level = staircase(front, reference)
    xs = np.concatenate([lo[1:], [hi[-1]]])
    ys = np.concatenate([level[1:], [level[-1]]])
    return xs, ys


def plot_front(
    path: str,
    points: np.ndarray | Sequence[Sequence[float]],
    *,
    best: np.ndarray | Sequence[Sequence[float]] | None = None,
    worst: np.ndarray | Sequence[Sequence[float]] | None = None,
    reference: Sequence[float] = DEFAULT_REFERENCE,
    title: str = "privacy-utility Pareto front",
) -> str:
    """Save a PNG of all evaluated points and their Pareto front (matplotlib Agg).

    Args:
        path: The PNG file to write.
        points: ``(n, 2)`` (epsilon, error) points.
        best: The same configurations scored by their best runs, or ``None``; with ``worst``, their fronts bound
            the shaded variability band (DPareto Sec. 4.3, "Variability", Fig. 7).
        worst: The same configurations scored by their worst runs, or ``None``.
        reference: The anti-ideal point (the staircase ends at its epsilon).
        title: The figure's title.

    Returns:
        The file's path.

    Raises:
        ValueError: An input is malformed.
    """  # noqa: DOC502
    plt = pyplot()

    ref = _reference(reference)
    arr = _points(points)
    fig, ax = plt.subplots(figsize=(6, 4.2))
    ax.scatter(arr[:, 0], arr[:, 1], s=10, c="0.6", label="evaluated", zorder=2)
    front = pareto_front(arr)
    xs, ys = _step_xy(front, ref)
    ax.step(xs, ys, where="post", color="C0", lw=2, label="Pareto front (mean of runs)", zorder=3)
    if best is not None and worst is not None:
        bxs, bys = _step_xy(pareto_front(best), ref)
        wxs, wys = _step_xy(pareto_front(worst), ref)
        grid = np.unique(np.concatenate([bxs, wxs]))
        grid = grid[np.isfinite(grid)]
        upper = _step_eval(wxs, wys, grid, ref[1])
        lower = _step_eval(bxs, bys, grid, ref[1])
        ax.fill_between(grid, lower, upper, step="post", color="C0", alpha=0.2,
                        label="best/worst-run fronts")
    if len(arr) and (arr[:, 0] > 0).all():
        ax.set_xscale("log")
    ax.set_xlabel("epsilon")
    ax.set_ylabel("error (1 - utility)")
    ax.set_ylim(0, max(1.0, float(ref[1])) * 1.02)
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize=8)
    return save_figure(fig, path, dpi=120)


def _step_eval(xs: np.ndarray, ys: np.ndarray, grid: np.ndarray, default: float) -> np.ndarray:
    """Value of a post-step function (breakpoints ``xs``, levels ``ys``) on ``grid``."""
    idx = np.searchsorted(xs, grid, side="right") - 1
    out = np.full(len(grid), default, dtype=np.float64)
    ok = idx >= 0
    out[ok] = ys[idx[ok]]
    return out


def plot_hypervolume_curves(
    path: str,
    curves: Mapping[str, np.ndarray | Sequence[float]],
    *,
    title: str = "hypervolume vs evaluations",
) -> str:
    """Save a PNG of one hypervolume-vs-evaluations curve per method and return its path."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6, 4.2))
    for label, curve in curves.items():
        values = np.asarray(curve, dtype=np.float64)
        ax.plot(np.arange(1, len(values) + 1), values, label=label)
    ax.set_xlabel("evaluations")
    ax.set_ylabel("hypervolume")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    return save_figure(fig, path, dpi=120)
