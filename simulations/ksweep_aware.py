"""Data-aware depths: argmax releases whose depth reads the clients' data, measured on the ballot grid's points.

A rule of public facts gives every federation of a cell ``(relation, n, epsilon)`` the same ``k``. Each family
here lets the data choose how deep the vote reaches, in one of the three ways such a choice can be paid for
(inside each client, inside the release, or by a first release):

* ``score``: inside each client, at no privacy cost: the graded ballot ``score:M:BITS``
  (`dphype.selection.voting.score_votes`), so a client with many near-ties votes deep and one with a clear best votes
  shallow; the release's noise grows with its largest entry ``G = 2**BITS - 1`` (`dphype.privacy.winner`);
* ``joint``: inside the release, at no extra cost: report-noisy-max over every pair (depth ``k`` of `JOINT_DEPTHS`,
  candidate ``c``) of ``count_k(c) - beta n k / p`` plus one discrete Laplace of the release's epsilon each. One
  client changes each pair's count by at most 1 (moving them all one way under add-remove), so this is the argmax
  release's mechanism over ``|JOINT_DEPTHS| p`` counts, epsilon-DP; the offsets are public, and only ``c`` is
  released. What a committee would compute if each client sent its nested top-k ballots at every depth;
* ``shallow``: the same with two depths: ``k = 2`` with a public bonus ``a`` on its counts, and the
  auto ballot's ``k`` (`dphype.selection.voting.auto_depth`): a federation whose clients nearly all put the same
  candidates in their top 2 is released from there, any other from the default's depth;
* ``uncertain``: inside each client, at no privacy cost: top-``d_i`` with the client's own depth ``d_i``, the
  number of its candidates whose validation accuracy is within ``z`` binomial standard errors of its best
  (`uncertain_depths`; at least the auto ballot's ``k`` where ``floor`` is 1), ranked by accuracy where it holds
  fewer than ``V`` validation rows, else by validation loss (the default key). A client with few validation rows,
  or many near-ties, votes deep; one with a clear best votes shallow. Each entry stays 0 or 1, which is all the
  winner release's noise hides (`dphype.privacy.winner`: only the per-entry range enters its proof), so the depth
  and the key, functions of the client's own data, cost nothing (the form's total bounds become ``[1, p / 2]``);
* ``skew``: a first release composed in the ledger: each client's label shares ``q_i`` (``C`` classes) and
  ``|q_i|^2``, summed with Laplace noise of scale ``3 / epsilon_1`` per coordinate (one client moves the sum by at
  most 2 + 1 in l1 under replace-one, ``1 + 1`` under add-remove, so it is ``epsilon_1``-DP with ``epsilon_1 = f
  epsilon``), estimate how far the clients' label mixes are from their mean, ``V = mean |q_i|^2 - |mean q_i|^2``
  (`label_spread`; the noise's bias on the second term removed); a federation with ``V > T`` votes top-``D``, any
  other the auto ballot's ``k``, in the argmax release with ``epsilon - epsilon_1``;
* ``small``: ``uncertain`` (with the auto ballot's ``k`` as each client's least depth) in a federation of at most
  ``N`` clients, the auto ballot in any larger one: one public fact, ``n``, chooses between them, so it costs what
  each costs, nothing;
* ``threshold``: a first round composed in the ledger: AboveThreshold (Dwork and Roth 2014, Algorithm 1; Laplace
  noise ``2 / epsilon_1`` on the threshold ``T n``, ``4 / epsilon_1`` per query) with ``epsilon_1 = f epsilon`` over
  the top count at ``k = 1, 2, ...`` of `JOINT_DEPTHS` stops at the first depth whose top count passes ``T n``
  (the last depth if none does); then the argmax release at that depth with ``epsilon - epsilon_1``.

Each family is measured at every point for every row of its parameter grid (`PARAMETERS`): the gap to Opt in
accuracy points and the share of releases within 2 points of Opt, exactly where the release is one report-noisy-max
(`dphype.privacy.winner.winner_probabilities`), from ``repetitions`` seeded draws where a draw chooses the depth.
``dphype bench ksweep-loto`` then fits each family's parameters on all tasks but one and measures them on the one
left out, beside the rules of public facts, against the same goals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dphype.privacy.winner import discrete_laplace, noise_std, winner_probabilities
from dphype.selection.voting import Ballot, auto_depth, ranking
from simulations import harness

#: The depths the ``joint`` and ``threshold`` families choose from.
JOINT_DEPTHS = tuple(range(1, 21))
#: The parameter grid of each family: names, then one tuple per row.
PARAMETERS: dict[str, tuple[tuple[str, ...], tuple[tuple[float, ...], ...]]] = {
    "score": (("M", "bits"), tuple((m, b) for m in (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64) for b in (1, 2))),
    "joint": (("beta",), tuple((b,) for b in (0.5, 1.0, 2.0, 4.0, 6.0, 8.0, 12.0))),
    "shallow": (("a",), tuple((a,) for a in (0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0))),
    "threshold": (("f", "T"), tuple((f, t) for f in (0.05, 0.1, 0.2, 0.3) for t in (0.5, 0.7, 0.9, 1.0))),
    "skew": (("f", "T", "D"), tuple((f, t, d) for f in (0.1, 0.2, 0.35, 0.5) for t in (0.03, 0.06, 0.1)
                                     for d in (5.0, 8.0, 12.0, 16.0))),
    "uncertain": (("z", "V", "floor"), tuple((z, v, floor) for z in (0.0, 0.5, 1.0, 2.0)
                                             for v in (0.0, 10.0, 25.0, 1e9) for floor in (0, 1))),
    "small": (("z", "V", "N"), tuple((z, v, n) for z in (0.0, 0.5, 1.0, 2.0) for v in (0.0, 10.0, 25.0, 1e9)
                                     for n in (10.0, 20.0))),
}
#: The forms the report shows.
FORMS = {"score": "score:M:bits ballot (each client's depth from its own margin)",
         "joint": "noisy max over (k, c) of count_k(c) - beta n k / p, k <= 20",
         "shallow": "noisy max over (k, c), k = 2 or auto's k, of count_k(c) + a [k = 2]",
         "threshold": "AboveThreshold (f epsilon) on top count >= T n, then argmax ((1 - f) epsilon)",
         "skew": "label spread V released with f epsilon (Laplace); V > T: top-D, else auto's k; argmax with the rest",
         "small": "the uncertain ballot (floor 1) where n <= N, else the auto ballot (the shipped constant)",
         "uncertain": "top-d_i, d_i = the client's candidates within z binomial SE of its best accuracy (at least "
                      "auto's k if floor = 1), ranked by accuracy on fewer than V validation rows, else by loss"}


@dataclass(frozen=True)
class Federation:
    """One federation's arrays: each client's score keys ``(n, p, j)`` as its validation ranks them, every candidate's
    test accuracy ``(p,)``, and each client's keys ``(accuracy, -loss)`` ``(n, p, 2)`` with its validation rows
    ``(n,)`` (the ``uncertain`` family) and each client's label shares ``(n, C)`` (the ``skew`` family); ``None``
    where not known."""

    scores: np.ndarray
    accuracy: np.ndarray
    local: np.ndarray | None = None
    validation_rows: np.ndarray | None = None
    labels: np.ndarray | None = None


def outcome(probabilities: np.ndarray, accuracy: np.ndarray) -> tuple[float, float]:
    """``(gap to Opt in points, share within 2 points)`` of a distribution over the candidates."""
    gap = 100.0 * (accuracy.max() - accuracy)
    return float(probabilities @ gap), float(probabilities[gap <= 2.0 + 1e-9].sum())


def depth_counts(scores: np.ndarray, depths: Sequence[int]) -> np.ndarray:
    """The top-k vote counts at each depth, ``(len(depths), p)``: each client ranked once (`ranking`, as
    `dphype.selection.voting.top_k_votes` ranks), its top-k ballot at every ``k`` cut from that ranking."""
    n, p = scores.shape[:2]
    position = np.empty((n, p), dtype=np.int64)
    position[np.arange(n)[:, None], np.stack([ranking(row) for row in scores])] = np.arange(p)
    return (position[None, :, :] < np.asarray(depths)[:, None, None]).sum(axis=1)


def depth_release(scores: np.ndarray, depth: int, epsilon: float, relation: str) -> np.ndarray:
    """``(p,)``: exactly how often the argmax release of the top-``depth`` ballots on ``scores`` releases each
    candidate (`dphype.privacy.winner.winner_probabilities`)."""
    return winner_probabilities(depth_counts(scores, [depth])[0], epsilon, relation)


def _pair_release(fed: Federation, depths: Sequence[int], shifts: np.ndarray, epsilon: float, relation: str,
                  repetitions: int, rng: np.random.Generator) -> list[tuple[float, float]]:
    """Report-noisy-max over (depth, candidate) of ``count_k(c) + shift_k`` for each row of public ``shifts``
    ``(rows, len(depths))``, from ``repetitions`` draws shared by all rows; the released candidate's outcome."""
    counts = depth_counts(fed.scores, depths)
    p = counts.shape[1]
    noisy = counts[None] + discrete_laplace((repetitions, *counts.shape), epsilon=epsilon, neighbouring=relation,
                                            rng=rng)
    out = []
    for shift in shifts:
        picks = (noisy + shift[None, :, None]).reshape(repetitions, -1).argmax(axis=1) % p
        out.append(outcome(np.bincount(picks, minlength=p) / repetitions, fed.accuracy))
    return out


def uncertain_depths(local_accuracy: np.ndarray, validation_rows: np.ndarray, z: float) -> np.ndarray:
    """Each client's count of candidates whose validation accuracy is within ``z`` binomial standard errors of its
    best: ``a >= b - z sqrt(b~ (1 - b~) / v)``, ``b`` the client's best accuracy on its ``v`` validation rows and
    ``b~ = (b v + 1) / (v + 2)`` (never 0 or 1, so a perfect score still has an error). Non-finite accuracies count
    as never within; a client with none gets 1.

    Args:
        local_accuracy: ``(n, p)`` validation accuracies.
        validation_rows: ``(n,)`` validation rows per client, ``>= 1``.
        z: Standard errors, ``>= 0``.

    Returns:
        ``(n,)`` int64 depths in ``[1, p]``.
    """
    finite = np.isfinite(local_accuracy)
    acc = np.where(finite, local_accuracy, -np.inf)
    best = acc.max(axis=1)
    v = np.asarray(validation_rows, dtype=np.float64)
    smooth = (np.where(np.isfinite(best), best, 0.0) * v + 1.0) / (v + 2.0)
    error = np.sqrt(smooth * (1.0 - smooth) / v)
    within = finite & (acc >= (best - z * error - 1e-12)[:, None])
    return np.maximum(1, within.sum(axis=1)).astype(np.int64)


def uncertain_counts(fed: Federation, z: float, rows: float, floor: int) -> np.ndarray:
    """The ``(p,)`` counts of the ``uncertain`` ballots: each client's top-``max(d_i, floor)`` (`uncertain_depths`,
    at most ``p / 2``), ranked by accuracy (keys ``(accuracy, -loss)``) where it holds fewer than ``rows`` validation
    rows, else by loss (``(-loss, accuracy)``)."""
    assert fed.local is not None and fed.validation_rows is not None
    n, p = fed.local.shape[:2]
    depth = np.minimum(np.maximum(uncertain_depths(fed.local[..., 0], fed.validation_rows, z), floor),
                       max(1, p // 2))
    by_accuracy = fed.validation_rows < rows
    position = np.empty((n, p), dtype=np.int64)
    position[np.arange(n)[:, None], np.stack([ranking(row if acc else row[:, ::-1])
                                              for row, acc in zip(fed.local, by_accuracy, strict=True)])] = np.arange(p)
    return (position < depth[:, None]).sum(axis=0)


def uncertain_family(fed: Federation, epsilon: float, relation: str, rows: Sequence[tuple[float, float, float]]
                     ) -> list[tuple[float, float]]:
    """The ``uncertain`` ballots' argmax release, exactly, per row ``(z, V, floor)`` (``floor`` 1: the auto
    ballot's ``k`` at this point)."""
    n, p = fed.scores.shape[:2]
    auto = auto_depth(p, noise_std(epsilon, relation), n)
    return [outcome(winner_probabilities(uncertain_counts(fed, z, v, auto if floor else 1), epsilon,
                                          relation), fed.accuracy) for z, v, floor in rows]


def score_family(fed: Federation, epsilon: float, relation: str, margin: float, bits: int) -> tuple[float, float]:
    """The ``score:M:BITS`` ballot's argmax release, exactly."""
    ballot = Ballot.parse(f"score:{margin:g}:{int(bits)}")
    counts = np.stack([ballot.cast(row, 1) for row in fed.scores]).sum(axis=0)
    return outcome(winner_probabilities(counts, epsilon, relation, ballot.max_entry), fed.accuracy)


def joint_family(fed: Federation, epsilon: float, relation: str, betas: Sequence[float], repetitions: int,
                 rng: np.random.Generator) -> list[tuple[float, float]]:
    """Report-noisy-max over (depth of `JOINT_DEPTHS`, candidate) with the offsets ``beta n k / p``, per ``beta``."""
    n, p = fed.scores.shape[:2]
    depths = np.asarray(JOINT_DEPTHS, dtype=np.float64)
    return _pair_release(fed, JOINT_DEPTHS, -np.outer(betas, depths) * n / p, epsilon, relation, repetitions, rng)


def shallow_family(fed: Federation, epsilon: float, relation: str, bonuses: Sequence[float], repetitions: int,
                   rng: np.random.Generator) -> list[tuple[float, float]]:
    """Report-noisy-max over (depth, candidate), depths 2 and `auto_depth`'s, with the bonus ``a`` on depth 2, per
    ``a``."""
    n, p = fed.scores.shape[:2]
    deep = auto_depth(p, noise_std(epsilon, relation), n)
    shifts = np.column_stack([bonuses, np.zeros(len(bonuses))])
    return _pair_release(fed, (2, deep), shifts, epsilon, relation, repetitions, rng)


def threshold_family(fed: Federation, epsilon: float, relation: str, rows: Sequence[tuple[float, float]],
                     repetitions: int, rng: np.random.Generator) -> list[tuple[float, float]]:
    """AboveThreshold's depth from ``repetitions`` draws (shared by the rows of one ``f``), then each depth's argmax
    release exactly, for each row ``(f, T)``."""
    counts = depth_counts(fed.scores, JOINT_DEPTHS)
    n = fed.scores.shape[0]
    top = counts.max(axis=1)
    exact: dict[tuple[int, float], tuple[float, float]] = {}
    draws: dict[float, tuple[np.ndarray, np.ndarray]] = {}
    out = []
    for fraction, level in rows:
        first = fraction * epsilon
        if fraction not in draws:  # unit Laplace draws, scaled per f
            draws[fraction] = (rng.laplace(0.0, 1.0, repetitions), rng.laplace(0.0, 1.0, (repetitions, top.size)))
        rho, nu = draws[fraction]
        passed = top[None, :] + 4.0 / first * nu >= (level * n + 2.0 / first * rho)[:, None]
        chosen = np.where(passed.any(axis=1), passed.argmax(axis=1), top.size - 1)
        weights = np.bincount(chosen, minlength=top.size) / repetitions
        gap = within = 0.0
        for d in np.flatnonzero(weights):
            key = (int(d), epsilon - first)
            if key not in exact:
                exact[key] = outcome(winner_probabilities(counts[d], epsilon - first, relation), fed.accuracy)
            gap += weights[d] * exact[key][0]
            within += weights[d] * exact[key][1]
        out.append((gap, within))
    return out


def small_family(fed: Federation, epsilon: float, relation: str, rows: Sequence[tuple[float, float, float]]
                 ) -> list[tuple[float, float]]:
    """The ``small`` family per row ``(z, V, N)``, exactly: `uncertain_family` (floor 1) where ``n <= N``, else the
    auto ballot's argmax release."""
    n, p = fed.scores.shape[:2]
    auto = outcome(depth_release(fed.scores, auto_depth(p, noise_std(epsilon, relation), n), epsilon, relation),
                   fed.accuracy)
    return [uncertain_family(fed, epsilon, relation, [(z, v, 1)])[0] if n <= most else auto for z, v, most in rows]


def label_spread(shares: np.ndarray) -> float:
    """``V = mean_i |q_i|^2 - |mean_i q_i|^2 = mean_i |q_i - mean q|^2`` of the clients' label shares ``(n, C)``: 0
    where every client holds the same mix, up to ``1 - 1 / C`` where each holds one class."""
    return float((shares**2).sum(axis=1).mean() - (shares.mean(axis=0) ** 2).sum())


#: The l1 distance one client moves the skew release's sum ``(sum q_i, sum |q_i|^2)``, per relation.
SKEW_SENSITIVITY = {"replace-one": 3.0, "add-remove": 2.0}


def noisy_spreads(shares: np.ndarray, epsilon: float, relation: str, rng: np.random.Generator,
                  draws: int) -> np.ndarray:
    """``draws`` releases of `label_spread` at ``epsilon`` (Laplace of scale `SKEW_SENSITIVITY` ``/ epsilon`` on
    each of the ``C + 1`` sums, the noise's expected ``|.|^2`` on the mean's square subtracted): ``(draws,)``."""
    n, c = shares.shape
    scale = SKEW_SENSITIVITY[relation] / epsilon
    total = shares.sum(axis=0)[None, :] + rng.laplace(0.0, scale, (draws, c))
    squares = (shares**2).sum() + rng.laplace(0.0, scale, draws)
    return squares / n - ((total / n) ** 2).sum(axis=1) + c * 2.0 * scale**2 / n**2


def skew_family(fed: Federation, epsilon: float, relation: str, rows: Sequence[tuple[float, float, float]],
                repetitions: int, rng: np.random.Generator) -> list[tuple[float, float]]:
    """The ``skew`` family per row ``(f, T, D)``: the depth from ``repetitions`` noisy spreads (shared by the rows
    of one ``f``), then each depth's argmax release at ``(1 - f) epsilon`` exactly."""
    assert fed.labels is not None
    n, p = fed.scores.shape[:2]
    spreads: dict[float, np.ndarray] = {}
    exact: dict[tuple[int, float], tuple[float, float]] = {}
    out = []
    for fraction, level, deep in rows:
        if fraction not in spreads:
            spreads[fraction] = noisy_spreads(fed.labels, fraction * epsilon, relation, rng, repetitions)
        rest = (1.0 - fraction) * epsilon
        depths = (auto_depth(p, noise_std(rest, relation), n), int(deep))
        weights = (float(np.mean(spreads[fraction] <= level)), float(np.mean(spreads[fraction] > level)))
        gap = within = 0.0
        for depth, weight in zip(depths, weights, strict=True):
            if weight == 0.0:
                continue
            if (depth, rest) not in exact:
                exact[depth, rest] = outcome(depth_release(fed.scores, depth, rest, relation), fed.accuracy)
            gap += weight * exact[depth, rest][0]
            within += weight * exact[depth, rest][1]
        out.append((gap, within))
    return out


def measure(family: str, fed: Federation, epsilon: float, relation: str, repetitions: int,
            rng: np.random.Generator) -> np.ndarray:
    """``(rows, 2)``: gap to Opt (points) and share within 2 points for each row of ``PARAMETERS[family]``.

    Args:
        family: One of `PARAMETERS`.
        fed: The federation's arrays.
        epsilon: The release's whole epsilon.
        relation: ``"replace-one"`` or ``"add-remove"``.
        repetitions: Draws of the depth (``joint``, ``skew``, ``threshold``).
        rng: The generator of those draws.

    Returns:
        One row per parameter row.

    Raises:
        ValueError: ``family`` is not one of `PARAMETERS`.
    """
    if family not in PARAMETERS:
        raise ValueError(f"family must be one of {', '.join(PARAMETERS)}, got {family!r}")
    rows = PARAMETERS[family][1]
    if family == "score":
        return np.array([score_family(fed, epsilon, relation, m, int(b)) for m, b in rows])
    if family == "joint":
        return np.array(joint_family(fed, epsilon, relation, [b for (b,) in rows], repetitions, rng))
    if family == "shallow":
        return np.array(shallow_family(fed, epsilon, relation, [a for (a,) in rows], repetitions, rng))
    if family == "uncertain":
        return np.array(uncertain_family(fed, epsilon, relation, [(z, k, f) for z, k, f in rows]))
    if family == "small":
        return np.array(small_family(fed, epsilon, relation, [(z, v, m) for z, v, m in rows]))
    if family == "skew":
        return np.array(skew_family(fed, epsilon, relation, [(f, t, d) for f, t, d in rows], repetitions, rng))
    return np.array(threshold_family(fed, epsilon, relation, [(f, t) for f, t in rows], repetitions, rng))


def load_federation(dataset: str, clients: int, partition: str, *, cache: harness.ArrayCache, candidates: Any,
                    validation: str, seed: int, data_dir: str | None = None) -> Federation:
    """A ksweep point's federation (``partition`` as the runs label it: ``iid``, ``beta=B``) at the bench's default
    scale, from the cache of its run (the arrays are computed there if missing, as ``dphype bench ksweep`` would);
    ``data_dir`` is the run's ``--data-dir``. The validation rows are each client's single split's
    (`dphype.ml.validation.VALIDATION_FRACTION` of its shard)."""
    from dphype.ml.data import split_indices
    from dphype.ml.torch_task import default_epochs, load_cached, partition_cached
    from dphype.ml.validation import SINGLE_SPLIT, VALIDATION_FRACTION

    epochs = default_epochs(dataset)
    scale = harness.Scale(epochs, 5, epochs, validation=validation)
    fed = harness.Federation(dataset, int(clients), harness.parse_partition(partition.removeprefix("beta=")), seed,
                             data_dir)
    accuracy = harness.fill_diverged(harness.cached_accuracies(fed, candidates, scale, cache),
                                     load_cached(dataset, data_dir)[1].y)
    local = harness.cached_scores(fed, candidates, harness.Scale(epochs, 5, epochs, validation=SINGLE_SPLIT), cache)
    shards = partition_cached(dataset, fed.clients, seed, fed.partition, fed.beta, data_dir)
    rows = np.array([len(split_indices(len(shard), VALIDATION_FRACTION, seed)[1]) for shard in shards])
    labels = np.asarray(load_cached(dataset, data_dir)[0].y).astype(np.int64)
    shares = np.stack([np.bincount(labels[shard], minlength=int(labels.max()) + 1) / len(shard) for shard in shards])
    return Federation(harness.cached_scores(fed, candidates, scale, cache), accuracy, local, rows, shares)


def measure_points(families: Sequence[str], points: Sequence[tuple[str, int, str, float, str]], *,
                   cache: harness.ArrayCache, candidates: Any, validation: str, seed: int,
                   repetitions: int, data_dirs: dict[str, str] | None = None) -> dict[str, np.ndarray]:
    """Per family of ``families``: ``(rows, points, 2)``, `measure` at every point (data set, ``n``, partition,
    epsilon, relation), each point's draws seeded by ``seed`` and its position; ``data_dirs`` maps a data set to
    its runs' ``--data-dir``."""
    feds: dict[tuple[str, int, str], Federation] = {}
    out = {name: np.empty((len(PARAMETERS[name][1]), len(points), 2)) for name in families}
    for j, (dataset, clients, partition, eps, relation) in enumerate(points):
        key = (dataset, clients, partition)
        if key not in feds:
            feds[key] = load_federation(dataset, clients, partition, cache=cache, candidates=candidates,
                                        validation=validation, seed=seed, data_dir=(data_dirs or {}).get(dataset))
        for f_index, name in enumerate(families):
            out[name][:, j] = measure(name, feds[key], eps, relation, repetitions,
                                      np.random.default_rng([seed, j, f_index]))
    return out
