"""Plan a DP-Hype run before any data is touched: which ``k`` and release the scenario favours, and what is known.

For a range of ``k`` the planner simulates, under a stated consensus scenario (`dphype.selection.scenarios`), the
success of the selection rule that will run and of the argmax, with Theorem IV.1's bound, for both kinds of release
(`dphype.selection.forecasts`); recommends the ``k`` with the highest simulated success (the winner release's ties:
`_winner_tie_break`), and finds the smallest epsilon and the smallest number of clients that reach a target success
(bisection with common random numbers). The planner names no release mode: its caller passes the run's mode and the
modes to compare (`PlannedRelease`, which `dphype.release.ReleaseMode` implements). The plan recommends ``k`` for each
forecast and, among the modes passed, the one with the higher simulated success at its recommended ``k`` (ties: the
first passed, the sum release in `dphype.release.RELEASE_MODES`).

The scenario is a model, not the user's data: the plan (`dphype.selection.plan_result.Plan`) claims no chance of a
good pick on it, and quotes what the bench measured where it measured the run's release and ballot
(`dphype.selection.measured`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from dphype.checks import (
    DEFAULT_NOISE,
    MAX_CLIENTS,
    check_clients,
    check_delta,
    check_dropout,
    check_epsilon,
    check_int,
    check_k,
    check_neighbouring,
    check_probability,
)
from dphype.privacy.noise_kinds import resolve_accountant
from dphype.selection.forecasts import (
    Forecast,
    ForecastSetting,
    PlannedRelease,
    simulated_success,
    theorem_iv1_success,
    unanimous_success,
)
from dphype.selection.loss_model import LossModel, ranking_from_losses, ranking_prefix, vote_counts
from dphype.selection.measured import MEASURED_BALLOT, measured_ballots, measured_within
from dphype.selection.plan_result import DEFAULT_TARGET, WARN_BELOW, Plan, warnings
from dphype.selection.rules import DEFAULT_RULE, check_rule, selection_rule
from dphype.selection.scenarios import (
    CONSENSUS,
    TIE_BREAK_DISAGREEMENT,
    Scenario,
    read_consensus,
    scenario,
    simulate_votes,
    tie_break_scenario,
)

if TYPE_CHECKING:
    from dphype.selection.candidates import FeatureSpace

__all__ = [
    "CONSENSUS", "DEFAULT_TARGET", "KS", "MEASURED_BALLOT", "TIE_BREAK_DISAGREEMENT", "WARN_BELOW", "Forecast",
    "LossModel", "Plan", "PlannedRelease", "Scenario", "check_plan", "measured_within", "plan", "ranking_from_losses",
    "ranking_prefix", "read_consensus", "scenario", "simulate_votes", "simulated_success", "theorem_iv1_success",
    "tie_break_scenario", "unanimous_success", "vote_counts", "warnings",
]

#: A refusal names the smallest federation that would reach ``min_success`` up to this many times the run's clients.
REFUSAL_SEARCH = 16

#: values of ``k`` the planner compares (those below the number of candidates)
KS: tuple[int, ...] = (1, 2, 3, 5, 8, 10, 15, 20, 25, 30, 40, 50)


def _bisect(ok: Any, lo: float, hi: float, ratio: float) -> float | None:
    """Smallest ``x`` in ``[lo, hi]`` with monotone ``ok(x)``, up to a factor ``ratio``; ``None`` if not ``ok(hi)``."""
    if not ok(hi):
        return None
    if ok(lo):
        return lo
    while hi / lo > ratio:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def _smallest_clients(ok: Any, start: int, most: int = MAX_CLIENTS) -> int | None:
    """Smallest ``n`` in ``[2, most]`` with ``ok(n)`` for ``ok`` monotone in ``n``.

    ``None`` if not ``ok(most)``. Brackets the answer by halving down or doubling up from ``start`` (the
    run's own n, near which the answer usually lies), then bisects exactly: the simulations stay near the answer
    instead of starting with ``MAX_CLIENTS`` simulated clients.
    """
    lo = hi = min(max(start, 2), most)
    if ok(hi):
        while hi > 2:
            lo = max(2, hi // 2)
            if not ok(lo):
                break
            hi = lo
        else:
            return 2
    else:
        while True:
            if lo >= most:
                return None
            hi = min(2 * lo, most)
            if ok(hi):
                break
            lo = hi
    while hi - lo > 1:  # not ok(lo), ok(hi)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def plan(
    clients: int,
    epsilon: float,
    delta: float,
    space: FeatureSpace | None,
    num_candidates: int,
    *,
    k: int | None = None,
    dropout: float = 0.0,
    consensus: str | float = "moderate",
    num_good: int | None = None,
    target: float = DEFAULT_TARGET,
    rule: str | None = None,
    noise: str = DEFAULT_NOISE,
    accountant: str | None = None,
    neighbouring: str = "replace-one",
    ks: Sequence[int] | None = None,
    repetitions: int = 200,
    seed: int = 0,
    search: bool = True,
    release: PlannedRelease | None = None,
    releases: Sequence[PlannedRelease] = (),
    ballot: str | None = None,
    most_clients: int = MAX_CLIENTS,
    partition: str | None = None,
) -> Plan:
    """Predict a DP-Hype run of ``clients`` clients at ``(epsilon, delta)`` over ``num_candidates`` public candidates.

    Both forecasts (`Forecast`) are predicted whatever ``release`` is.

    Args:
        clients: The number ``n`` of clients.
        epsilon: The run's epsilon.
        delta: The run's delta.
        space: The candidates' feature space (``None`` or structureless: the rule falls back to the argmax).
        num_candidates: The number ``p`` of candidates.
        k: Votes per client; ``None`` recommends ``k`` among ``ks`` and reports at it.
        dropout: The tolerated dropout fraction.
        consensus: The consensus scenario (`scenario`).
        num_good: The scenario's number of good candidates (`scenario`).
        target: The success that ``min_epsilon`` and ``min_clients`` aim at.
        rule: The selection rule (default `dphype.selection.rules.DEFAULT_RULE`).
        noise: The noise kind.
        accountant: The accountant (``None``: the noise kind's default).
        neighbouring: The neighbouring relation.
        ks: The values of ``k`` to compare (default `KS` below ``num_candidates``).
        repetitions: Simulated runs per point, at least 10.
        seed: The simulation's seed.
        search: ``False`` skips the searches for ``min_epsilon`` and ``min_clients`` (reported as ``None``).
        release: The run's mode (e.g. ``DPHypeConfig.mode``; ``None``: report the noisy-sum forecast, unnamed).
        releases: The modes to recommend among (default: ``release`` alone; `dphype.release.release_modes` for
            all).
        ballot: The run's ballot name: with the winner release and a ballot the bench measured
            (`dphype.selection.measured.measured_ballots`) the plan carries the measured shares within 1 and 2 points
            of Opt (`measured_within`), which the scenario cannot predict.
        most_clients: The largest ``n`` the search for ``min_clients`` tries (``None`` above it).
        partition: How the run's data is split across its clients, for the measured cell (``"iid"``,
            ``"dirichlet"``; ``None``: unknown, every measured partition counts).

    Returns:
        The plan, with its warnings.

    Raises:
        ValueError: If a parameter is out of range, ``space`` has another number of candidates, or ``ks`` holds
            no ``k`` below ``num_candidates``.
    """
    clients = check_clients(clients)
    epsilon = check_epsilon(epsilon)
    p = check_int("num_candidates", num_candidates, 2)
    if space is not None and space.num_candidates != p:
        raise ValueError(f"space has {space.num_candidates} candidates, num_candidates is {p}")
    chosen_k = None if k is None else check_k(k, p)
    setting = ForecastSetting(
        delta=check_delta(delta), dropout=check_dropout(dropout), num_candidates=p, space=space,
        scenario=scenario(p, consensus, num_good), rule=check_rule(DEFAULT_RULE if rule is None else rule),
        noise=noise, accountant=resolve_accountant(accountant, noise), neighbouring=check_neighbouring(neighbouring),
        repetitions=check_int("repetitions", repetitions, 10), seed=check_int("seed", seed, 0),
        inflation=1.0 if release is None else float(release.noise_inflation))
    target = check_probability("target", target)
    forecast = Forecast.NOISY_SUM if release is None else release.forecast
    chosen = set() if chosen_k is None else {chosen_k}
    compare = sorted({check_k(x, p) for x in (KS if ks is None else ks) if x < p} | chosen)
    if not compare:
        raise ValueError(f"ks must contain at least one k in [1, {p - 1}], got {ks!r}")
    voters, counts, good = setting.votes(clients, compare)
    by_k: list[dict[str, Any]] = []
    for kk in compare:
        sigma = setting.sigma(epsilon, kk)
        released = setting.inflation * sigma  # the noise the sum is released with
        by_k.append({"k": kk, "sigma": sigma,
                     "success": setting.success(counts[kk], good, released, clients, voters, kk, setting.rule),
                     "success_max_votes": setting.success(counts[kk], good, released, clients, voters, kk, "max-votes"),
                     "bound": theorem_iv1_success(counts[kk], good, sigma),
                     "success_winner": setting.winner_success(counts[kk], good, epsilon)})
    best = max(by_k, key=lambda row: (row["success"], -row["k"]))
    best_of = {Forecast.NOISY_SUM: best, Forecast.WINNER: _winner_tie_break(setting, by_k, epsilon, clients)}
    row = best_of[forecast] if chosen_k is None else next(r for r in by_k if r["k"] == chosen_k)
    kk = int(row["k"])
    sigma = setting.forecast_sigma(forecast, epsilon, kk)
    compared = list(releases) or ([] if release is None else [release])
    recommended = max(compared, key=lambda r: best_of[r.forecast][r.forecast.value], default=None)  # ties: first

    def reaches_epsilon(eps: float) -> bool:
        return setting.forecast_success(forecast, counts[kk], good, eps, clients, voters, kk) >= target

    def reaches_clients(n: int) -> bool:
        m, c, g = setting.votes(n, [kk])
        return setting.forecast_success(forecast, c[kk], g, epsilon, n, m, kk) >= target

    min_eps = _bisect(reaches_epsilon, 1e-3, 1e3, 1.02) if search else None
    min_n = _smallest_clients(reaches_clients, clients, most_clients) if search else None
    result = Plan(
        clients=clients, epsilon=epsilon, delta=setting.delta, dropout=setting.dropout, voters=voters,
        num_candidates=p, noise=setting.noise, accountant=setting.accountant, neighbouring=setting.neighbouring,
        rule=_rule_that_runs(setting), scenario=asdict(setting.scenario), target=target, k=kk,
        sigma=sigma, success=row[forecast.value], success_max_votes=row["success_max_votes"], bound=row["bound"],
        recommended_k=int(best["k"]), by_k=by_k, release=None if release is None else release.name,
        success_winner=row["success_winner"], recommended_k_winner=int(best_of[Forecast.WINNER]["k"]),
        recommended_release=None if recommended is None else recommended.name,
        min_epsilon=None if min_eps is None else float(f"{min_eps:.3g}"),
        min_clients=None if min_n is None else int(min_n),
        unanimous_success=unanimous_success(voters, kk, p, sigma),
        within_opt=measured_within(clients, epsilon, setting.neighbouring, p, ballot, partition)
        if forecast is Forecast.WINNER and ballot in measured_ballots(neighbouring=setting.neighbouring) else None)
    return Plan(**{**asdict(result), "warnings": warnings(result)})



def _winner_tie_break(setting: ForecastSetting, by_k: list[dict[str, Any]], epsilon: float,
                      clients: int) -> dict[str, Any]:
    """The row of the winner release's recommended ``k``: the highest ``success_winner``.

    When several ``k`` reach it (at a large epsilon every ``k`` from some on simulates success 1.0) the scenario cannot
    tell them apart, and the tie goes to

    1. the scenario's number of good candidates ``|H_good|`` (a vote for exactly the good ones) if it is tied;
    2. else the tied ``k`` with the highest success under `tie_break_scenario` (clients that agree half as well),
       simulated as `plan` would with that scenario (each tied row gets ``success_winner_tie_break``); then the
       smallest ``k``.

    The rule follows ``dphype bench ksweep`` (results/releases.md, the planner's k against the measured sweep): the
    smallest saturated ``k`` lands far from Opt under label skew, and a large ``k`` lets many candidates reach the
    ceiling of ``n`` votes, where the lowest index wins.
    """
    top = max(row["success_winner"] for row in by_k)
    tied = [row for row in by_k if row["success_winner"] == top]
    if len(tied) == 1:
        return tied[0]
    good = next((row for row in tied if row["k"] == setting.scenario.num_good), None)
    if good is not None:
        return good
    weaker = replace(setting, scenario=tie_break_scenario(setting.scenario))
    voters, counts, is_good = weaker.votes(clients, [row["k"] for row in tied])
    for row in tied:
        row["success_winner_tie_break"] = weaker.winner_success(counts[row["k"]], is_good, epsilon)
    return max(tied, key=lambda row: (row["success_winner_tie_break"], -row["k"]))


def _rule_that_runs(setting: ForecastSetting) -> str:
    return selection_rule(setting.rule).runs_as(setting.space)[0].name



def check_plan(
    clients: int,
    epsilon: float,
    delta: float,
    space: FeatureSpace | None,
    num_candidates: int,
    k: int,
    *,
    dropout: float = 0.0,
    min_success: float | None = None,
    **options: Any,
) -> Plan:
    """The check a server or the demo runs before any data is touched: the plan at the configured ``k``.

    Without the searches; refused below ``min_success`` (a federation too small to select), naming the number of
    clients (and the epsilon) that reach it; its ``warnings`` say when the predicted success is below `WARN_BELOW`
    or the release is noise.

    Args:
        clients: The number ``n`` of clients.
        epsilon: The run's epsilon.
        delta: The run's delta.
        space: The candidates' feature space.
        num_candidates: The number ``p`` of candidates.
        k: Votes per client.
        dropout: The tolerated dropout fraction.
        min_success: In ``[0, 1]``: refuse when the predicted success is below it; ``None``: never refuse.
        **options: Go to `plan` (``rule``, ``noise``, ``accountant``, ``neighbouring``, ``consensus``, ``num_good``,
            ``repetitions``, ``seed``, ``release``, ``releases``, ``ballot``, ``partition``).

    Returns:
        The plan.

    Raises:
        ValueError: If a parameter is out of range, or the predicted success is below ``min_success``.
    """  # noqa: DOC502
    if min_success is not None:
        check_probability("min_success", min_success)
    result = plan(clients, epsilon, delta, space, num_candidates, k=k, dropout=dropout, ks=[k], search=False,
                  **options)
    if min_success is not None and result.success < min_success:  # too small: search what would reach it
        most = min(MAX_CLIENTS, REFUSAL_SEARCH * clients)  # the search's cost grows with the clients it simulates
        reach = plan(clients, epsilon, delta, space, num_candidates, k=k, dropout=dropout, ks=[k],
                     target=min_success, most_clients=most, **options)
        size = (f"use clients >= {reach.min_clients}" if reach.min_clients is not None else
                f"even {most} clients would not reach it")
        more = "" if reach.min_epsilon is None else f" (or epsilon >= {reach.min_epsilon:g})"
        raise ValueError(f"clients={clients} is too few to select at epsilon {epsilon:g}: {size}{more}, or "
                         f"min-success = 0 to run anyway\nthe planner's {reach.scenario['name']} consensus scenario "
                         f"(a model, not your data) simulates a good pick with {result.success:.2f} < min-success "
                         f"{min_success:g} at k = {k} over {num_candidates} candidates; nothing was sent")
    warnings(result)
    return result

