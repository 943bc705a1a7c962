"""The plan: what the planner reports for one configuration, and the warnings it carries.

The scenario's simulated success is a model's answer, not a prediction for the user's data: the planner sees no
data. Where the bench measured the run's release and ballot, the plan carries the measured spread
(`dphype.selection.measured`) and says what would narrow it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from dphype.checks import check_probability

#: success the planner's ``min_epsilon`` and ``min_clients`` aim for unless told otherwise
DEFAULT_TARGET = 0.9
#: below this simulated success the server and the demo warn
WARN_BELOW = 0.5


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
        success_argmax: The argmax rule on the noisy sum at ``k``.
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
        within_opt: For the winner release with a measured ballot: the shares of releases within 1 and 2 points
            of Opt measured on the bench tasks nearest this ``(n, epsilon)`` (`measured_within`), or ``None``.
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
    success_argmax: float
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
        """What the planner knows of the chance of a good pick on the run's data, and what would narrow it, in words."""
        if self.predicted_success is not None:
            return f"predicted chance of a good pick {self.predicted_success:.2f}"
        words = "chance of a good pick on your data: unknown (the planner sees no data)"
        if self.within_opt is None:
            return (f"{words}; the bench measured no release like this one's; measuring the release on a public task "
                    "like yours (dphype bench ksweep) would tell what to expect")
        return (f"{words}; {measured_spread(self.within_opt)}; only a measurement on a task like yours (dphype bench "
                "ksweep) narrows it")



def measured_spread(within: dict[str, Any]) -> str:
    """The measured shares of a plan's `Plan.within_opt` in words."""
    return (f"on the bench tasks at n = {within['clients']}, epsilon = {within['epsilon']:g} with "
            f"{within['candidates']} candidates ({within['tasks']} federations: {within['measured_on']}) the "
            f"{within['ballot']} ballot put {within['within_2pt'][0]:.0%} to {within['within_2pt'][1]:.0%} of releases "
            f"within 2 points of Opt ({within['within_1pt'][0]:.0%} to {within['within_1pt'][1]:.0%} within 1)")


def warnings(result: Plan, min_success: float | None = None) -> list[str]:
    """The plan's warnings; a refusal when ``min_success`` is given and not reached.

    Args:
        result: The plan.
        min_success: The smallest simulated success (`Plan.success`) to accept, in ``[0, 1]``; ``None``: never
            refuse.

    Returns:
        The warnings: a release that is noise, a simulated success below `WARN_BELOW`, or a measured share within 2
        points of Opt below `DEFAULT_TARGET` at some measured task.

    Raises:
        ValueError: If the simulated success is below ``min_success``, or ``min_success`` is not in ``[0, 1]``.
    """
    out = []
    if result.unanimous_success < WARN_BELOW:
        out.append(f"epsilon {result.epsilon:g} is so small that the release is noise: even if all {result.voters} "
                   f"clients voted for the same {result.k} candidates, the argmax would pick one of them with "
                   f"probability {result.unanimous_success:.2f} (noise std sigma = {result.sigma:.1f} votes)")
    if result.success < WARN_BELOW:
        hint = (f"; reaching {result.target:g} needs epsilon >= {result.min_epsilon} or clients >= "
                f"{result.min_clients}" if result.min_epsilon is not None or result.min_clients is not None else "")
        out.append(f"the {result.scenario['name']} consensus scenario (a model, not your data) simulates a good pick "
                   f"with {result.success:.2f} (< {WARN_BELOW}) at k = {result.k}; `dphype plan` recommends "
                   f"k and the smallest epsilon and number of clients{hint}")
    if result.within_opt is not None and result.within_opt["within_2pt"][0] < DEFAULT_TARGET:
        out.append(f"the planner sees no data: {measured_spread(result.within_opt)} (k = {result.k} here); yours "
                   "depends on how well local scores predict the federated accuracy, which only a measurement on a "
                   f"task like yours (dphype bench ksweep) tells. The scenario's k (recommended_k_winner = "
                   f"{result.recommended_k_winner}) is a guess about data the planner cannot see")
    if min_success is not None:
        floor = check_probability("min_success", min_success)
        if result.success < floor:
            raise ValueError(f"the {result.scenario['name']} consensus scenario's simulated success "
                             f"{result.success:.2f} is below min_success = {floor:g}: refusing to run "
                             f"({'; '.join(out) or 'raise epsilon, clients or choose the recommended k'})")
    return out

