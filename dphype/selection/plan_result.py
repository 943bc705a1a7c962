"""The plan: what the planner reports for one configuration, and the warnings it carries.

The scenario's simulated success is a model's answer, not a prediction for the user's data: the planner sees no
data. Where the bench measured the run's release and ballot, the plan carries where the measured releases of the
nearest cell landed (`dphype.selection.measured`); `Plan.advice` says it in one line, in the run's own terms.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from dphype.checks import check_probability

#: success the planner's ``min_epsilon`` and ``min_clients`` aim for unless told otherwise
DEFAULT_TARGET = 0.9
#: below this simulated success the server and the demo warn
WARN_BELOW = 0.5
#: the longest `Plan.advice`: with a log line's prefix (Flower's ``WARNING :   ``, ``DP-Hype plan: ``) under 200
ADVICE_CHARS = 172


@dataclass(frozen=True)
class Plan:
    """What the planner predicts for one configuration (all keys of `to_dict` are JSON-ready).

    Attributes:
        clients: The number ``n`` of clients.
        epsilon: The run's epsilon.
        delta: The run's delta.
        dropout: The tolerated dropout fraction ``xi``.
        voters: The clients simulated as voting, the ``ceil((1 - xi) n)`` survivors.
        num_candidates: The number ``p`` of candidates.
        noise: The noise kind.
        accountant: The accountant, resolved.
        neighbouring: The neighbouring relation.
        rule: The selection rule that runs (the argmax where ``gp`` has no structure to use).
        scenario: The consensus scenario (`Scenario`, as a dict).
        target: The success that ``min_epsilon`` and ``min_clients`` aim at.
        k: The chosen ``k``, else the recommended one.
        sigma: The noise std of ``release`` at ``k``.
        success: The scenario's simulated chance that the run picks a good candidate at ``k`` (a model of data the
            planner cannot see, not a prediction for the run): ``rule`` on the noisy sum, or the
            winner release, as the mode's `Forecast` says.
        success_max_votes: The max-votes rule on the noisy sum at ``k``.
        bound: Theorem IV.1's bound for the argmax rule on the noisy sum at ``k``.
        recommended_k: The best ``k`` of the noisy sum.
        by_k: One row per compared ``k`` (both forecasts).
        release: The name of the mode the run uses (``None``: none was passed; the noisy-sum forecast applies).
        success_winner: The winner release at ``k``.
        recommended_k_winner: The best ``k`` of the winner release.
        recommended_release: The name of the mode passed with the higher success at its best ``k`` (``None``: no
            mode was passed).
        min_epsilon: Smallest epsilon whose success (of ``release``) at ``k`` reaches ``target`` (``None``: not
            within ``[1e-3, 1e3]``).
        min_clients: Smallest number of clients whose success (of ``release``) at ``k`` reaches ``target``
            (``None``: not within ``[2, MAX_CLIENTS]``).
        unanimous_success: The chance of a good pick if all voters voted for the same ``k`` candidates
            (`unanimous_success`).
        within_opt: For the winner release with a measured ballot: the gap to Opt and the shares of releases within
            1 and 2 points of Opt over the federations of the measured cell nearest the run
            (`dphype.selection.measured.measured_within`), or ``None``.
        predicted_success: A chance of a good pick on the run's data that the planner can back (calibrated out of
            sample on the measured grid); ``None``: unknown, and `advice` says what was measured and what would
            narrow it.
        warnings: The plan's warnings (`warnings`).
    """

    clients: int
    epsilon: float
    delta: float
    dropout: float
    voters: int
    num_candidates: int
    noise: str
    accountant: str
    neighbouring: str
    rule: str
    scenario: dict[str, Any]
    target: float
    k: int
    sigma: float
    success: float
    success_max_votes: float
    bound: float
    recommended_k: int
    by_k: list[dict[str, Any]]
    release: str | None
    success_winner: float
    recommended_k_winner: int
    recommended_release: str | None
    min_epsilon: float | None
    min_clients: int | None
    unanimous_success: float
    within_opt: dict[str, Any] | None = None
    predicted_success: float | None = None
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The plan as a JSON-ready dict, with its `advice`."""
        return {**asdict(self), "advice": self.advice()}

    def advice(self) -> str:
        """The plan in one line of at most `ADVICE_CHARS` characters, in the run's own terms; the rest is in `to_dict`.

        In order: a chance of a good pick the planner can back; else a release that is noise; else, where the bench
        measured the release and ballot, the gap to Opt over the federations of the nearest measured cell
        (`within_opt`: median and 90th percentile, the median share within 2 points where the line has room, and
        whether the run lies outside the measured range or the cell holds too few federations to tell); else the
        scenario's simulated chance, a model of data the planner cannot see. Where the line has no room, the details
        are left out first (they stay in `to_dict`).
        """
        head = f"{self.num_candidates} candidates, {self.clients} voters, epsilon {self.epsilon:g}: "
        if self.predicted_success is not None:
            return f"{head}predicted chance of a good pick {self.predicted_success:.2f}"
        if self.unanimous_success < WARN_BELOW:
            return _first_that_fits(
                f"{head}the release is noise (even {self.voters} unanimous votes win with "
                f"{self.unanimous_success:.2f}); raise epsilon or the number of voters",
                f"{head}the release is noise; raise epsilon or the number of voters")
        within = self.within_opt
        if within is None:
            hint = ("" if self.success >= WARN_BELOW or self.min_clients is None
                    else f"; {self.target:g} needs {self.min_clients} voters")
            line = (f"{head}the {self.scenario['name']} scenario (a model, not your data) simulates a good pick "
                    f"with {self.success:.2f} at k {self.k}{hint}")
            return _first_that_fits(f"{line}; the bench measured no release like this", line,
                                    f"{head}a scenario (not your data) simulates a good pick with {self.success:.2f}")
        gap = within["gap_points"]
        where = ("this cell" if within["on_grid"] else
                 f"p={within['candidates']} n={within['clients']} eps={within['epsilon']:g}")
        outside = [short for name, short in (("candidates", "p"), ("n", "n"), ("epsilon", "eps"))
                   if any(words.startswith(f"{name} ") for words in within["outside"])]
        caveat = ((f"; {', '.join(outside)} outside the grid" if outside else "")
                  + ("" if within["enough"] else "; too few runs to tell"))
        quote = f"{head}bench gap to Opt median {gap['median']:.1f}, p90 {gap['p90']:.1f} points"
        runs = f" over {within['federations']} runs"
        yours = "; yours: dphype bench ksweep"
        share = f", median {within['within_2pt']['median']:.0%} within 2"
        return _first_that_fits(f"{quote}{share}{runs} at {where}{caveat}{yours}",
                                f"{quote}{runs} at {where}{caveat}{yours}", f"{quote}{runs} at {where}{caveat}",
                                f"{quote}{runs} at the nearest cell{caveat}", f"{quote}{caveat}")


def _first_that_fits(*lines: str) -> str:
    """The first of ``lines`` (longest first) of at most `ADVICE_CHARS` characters, else the last."""
    return next((line for line in lines if len(line) <= ADVICE_CHARS), lines[-1])


def warnings(result: Plan, min_success: float | None = None) -> list[str]:
    """The plan's warnings; a refusal when ``min_success`` is given and not reached.

    Args:
        result: The plan.
        min_success: The smallest simulated success (`Plan.success`) to accept, in ``[0, 1]``; ``None``: never
            refuse.

    Returns:
        The warnings: a release that is noise, or a simulated success below `WARN_BELOW` (what the bench measured is
        in `Plan.advice` and `Plan.within_opt`).

    Raises:
        ValueError: If the simulated success is below ``min_success``, or ``min_success`` is not in ``[0, 1]``.
    """
    out = []
    if result.unanimous_success < WARN_BELOW:
        out.append(f"epsilon {result.epsilon:g} is so small that the release is noise: even if all {result.voters} "
                   f"clients voted for the same {result.k} candidates, the argmax would pick one of them with "
                   f"probability {result.unanimous_success:.2f} (noise std sigma = {result.sigma:.1f} votes)")
    if result.success < WARN_BELOW:
        needs = [f"{name} >= {value}" for name, value in (("epsilon", result.min_epsilon),
                                                           ("clients", result.min_clients)) if value is not None]
        hint = f"; reaching {result.target:g} needs {' or '.join(needs)}" if needs else ""
        out.append(f"the {result.scenario['name']} consensus scenario (a model, not your data) simulates a good pick "
                   f"with {result.success:.2f} (< {WARN_BELOW}) at k = {result.k}; `dphype plan` recommends "
                   f"k and the smallest epsilon and number of clients{hint}")
    if min_success is not None:
        floor = check_probability("min_success", min_success)
        if result.success < floor:
            raise ValueError(f"simulated success {result.success:.2f} is below min_success = {floor:g}: raise "
                             "epsilon or clients, or choose the recommended k\n"
                             f"(the {result.scenario['name']} consensus scenario, a model, not your data); refusing "
                             "to run"
                             + "".join(f"\n{line}" for line in out))
    return out

