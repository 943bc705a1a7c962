"""The private evaluation of the final model: each client's held-out accuracy and majority-class baseline, summed.

After the final training every contributing client reports two values of its own held-out rows, each in
``[0, 1]``: the final model's accuracy and the majority-class baseline (the accuracy of always guessing the most
frequent class of those rows). A client adds its noise share to them and the secure sum releases the noisy totals;
the server divides by the public number of contributors ``m``, so the released means are post-processing.

The mechanism is the vote's (Appendix A), on a vector of `EVALUATION_VALUES` entries:

* *Bounded contribution.* A value is sent on the fixed-point grid of `evaluation_scale` (Skellam, an integer kind:
  ``round(value * EVALUATION_SCALE)``, an integer in ``[0, EVALUATION_SCALE]``; a real kind sends the value rounded
  to the secure sum's grid ``1 / fixed_point_scale``, so that grid's rounding of value plus noise share rounds the
  share alone, as for a vote, never in a way that depends on the data). Whatever a client's data, each entry lies
  in ``[0, scale]``; a value outside ``[0, 1]`` (or not finite) is refused, never clipped (`quantize`).
* *Sensitivity.* Replacing one client's data moves each entry of the sum by at most ``scale``, and so does removing
  it (the zero-out form of add/remove, `dphype.privacy.accounting`): ``L2 = sqrt(2) scale`` and ``L1 = 2 scale`` under
  either relation (`evaluation_sensitivity`).
* *Noise.* ``sigma`` is solved exactly for the evaluation's ``(epsilon, delta)`` with the noise kind's accountant
  (`dphype.privacy.accounting.calibrate_sigma`); each client adds a share of variance ``sigma^2 / ((1 - xi) n)`` from
  the secure generator, and the release carries the survivors' shares (variance ``>= sigma^2``).
* *Composition.* The release's RDP curve (`evaluation_rdp`) adds to the selection's and the training's: each node's
  ledger composes it with its votes, and the run's guarantee composes it with the selection (and DP-FedAvg).

The released means of ``m`` contributors carry noise of std ``sigma_m / (scale m)`` each (`EvaluationResult`): the
accuracy error falls as ``1 / (epsilon m)``, so a small share of a run's epsilon says little at a few clients
(`evaluation_noise_std`; the documentation lists it at n = 20 and 50).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dphype.checks import check_delta, check_epsilon, check_positive
from dphype.privacy.accounting import RDP_ORDERS, calibrate_sigma, check_orders, mechanism_epsilon
from dphype.privacy.noise import check_survivors, client_noise_std
from dphype.privacy.noise_kinds import noise_kind, resolve_accountant

#: What each client reports, in this order: the final model's accuracy and the majority-class baseline.
EVALUATION_VALUES: tuple[str, ...] = ("accuracy", "majority_baseline")
#: The fixed-point grid of an integer noise kind: a value ``x`` in ``[0, 1]`` is sent as ``round(x * scale)``.
EVALUATION_SCALE = 1000
#: The evaluation's default share of the selection's epsilon (spent on top of it, composed in RDP).
DEFAULT_EVALUATION_SHARE = 0.5
#: The ledger's name of an evaluation release (`dphype.node.ledger.LedgerEntry.release`).
EVALUATION_RELEASE = "evaluation"
#: Where a pick below the baseline is explained (`EvaluationResult.verdict`).
COLLAPSE_GUIDE = "docs/ballots.md, \"Why the default trails where it does\""


def evaluation_scale(noise: str) -> int:
    """The grid ``scale`` of a value: `EVALUATION_SCALE` for an integer noise kind, 1 for a real one."""
    return EVALUATION_SCALE if noise_kind(noise).integer else 1


def evaluation_sensitivity(noise: str) -> tuple[float, float]:
    """``(L2, L1) = (sqrt(2) scale, 2 scale)`` of the summed values, under replace-one and add/remove alike."""
    scale, values = evaluation_scale(noise), len(EVALUATION_VALUES)
    return math.sqrt(values) * scale, float(values * scale)


def check_share(share: Any, name: str = "evaluation share") -> float:
    """The evaluation's share of epsilon, a finite number in ``(0, 1]``; else refused naming ``name`` and the fix."""
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not (math.isfinite(share) and 0 < share <= 1):
        raise ValueError(f"{name} must be a number in (0, 1], got {share!r}; set e.g. {DEFAULT_EVALUATION_SHARE:g}, "
                         "or turn the private evaluation off\n(the share of epsilon the private evaluation spends on "
                         "top of the selection)")
    return float(share)


def calibrate_evaluation(epsilon: float, delta: float, *, noise: str, accountant: str | None = None) -> float:
    """The total noise std (in grid units) making the evaluation release ``(epsilon, delta)``-DP.

    Args:
        epsilon: The evaluation's epsilon, ``> 0``.
        delta: The target delta, in ``(0, 1)``.
        noise: The noise kind's name.
        accountant: The accountant, ``None``/``"auto"``: the kind's default.

    Returns:
        ``sigma``, in units of the grid (`evaluation_scale`).

    Raises:
        ValueError: An argument is invalid.
    """  # noqa: DOC502
    return calibrate_sigma(*evaluation_sensitivity(noise), epsilon, delta, noise=noise, accountant=accountant)


def evaluation_epsilon(sigma: float, delta: float, *, noise: str, accountant: str | None = None) -> float:
    """Epsilon at ``delta`` of one evaluation release whose noise has total std ``sigma`` (grid units)."""
    accountant = resolve_accountant(accountant, noise)
    return mechanism_epsilon(*evaluation_sensitivity(noise), check_positive("sigma", sigma), noise,
                             check_delta(delta), accountant)


def evaluation_rdp(sigma: float, noise: str, orders: Any = RDP_ORDERS) -> np.ndarray:
    """RDP curve ``(m,)`` at ``orders`` of one evaluation release with noise of total std ``sigma`` (grid units)."""
    l2, l1 = evaluation_sensitivity(noise)
    return noise_kind(noise).rdp(check_orders(orders), l2, l1, check_positive("sigma", sigma))


def quantize(values: Any, noise: str) -> np.ndarray:
    """A client's `EVALUATION_VALUES` on the grid of `evaluation_scale` (float64; integers for an integer kind).

    A real kind's values are rounded to its secure-sum grid ``1 / fixed_point_scale`` (still in ``[0, 1]``), so the
    secure sum's rounding of value plus noise share (`dphype.secure.secure_sum.encode`) depends on the share alone.

    Args:
        values: The accuracy and the majority-class baseline of the client's held-out rows, each in ``[0, 1]``.
        noise: The noise kind's name.

    Returns:
        The ``(2,)`` vector to which the client adds its noise share.

    Raises:
        ValueError: ``values`` is not two finite numbers in ``[0, 1]`` (a contribution is refused, never clipped).
    """
    out = np.asarray(values, dtype=np.float64)
    if out.shape != (len(EVALUATION_VALUES),) or not np.all(np.isfinite(out)) or np.any((out < 0) | (out > 1)):
        raise ValueError(f"the evaluation must return ({', '.join(EVALUATION_VALUES)}), two numbers in [0, 1] "
                         f"measured on the node's held-out rows, got {values!r}")
    scale = evaluation_scale(noise)
    if scale > 1:
        return np.rint(out * scale)
    grid = noise_kind(noise).fixed_point_scale
    return np.rint(out * grid) / grid


def evaluation_noise_std(epsilon: float, delta: float, contributors: int, *, noise: str,
                         accountant: str | None = None) -> float:
    """The std of each released mean when ``contributors`` clients' shares carry exactly ``sigma^2``.

    Args:
        epsilon: The evaluation's epsilon, ``> 0``.
        delta: The target delta, in ``(0, 1)``.
        contributors: The number ``m`` of clients averaged, ``>= 1``.
        noise: The noise kind's name.
        accountant: The accountant.

    Returns:
        ``sigma / (scale m)``.
    """
    sigma = calibrate_evaluation(epsilon, delta, noise=noise, accountant=accountant)
    return sigma / (evaluation_scale(noise) * int(contributors))


@dataclass(frozen=True)
class EvaluationResult:
    """What the private evaluation released, with its noise and its privacy cost.

    Attributes:
        accuracy: The released mean over the contributors of the final model's held-out accuracy (noisy; may leave
            ``[0, 1]``).
        majority_baseline: The released mean of the majority-class baseline on the same rows (noisy).
        noise_std: The std of the noise in each released mean, ``sigma_m / (scale m)``.
        contributors: The clients whose values (and noise shares) the sum holds, ``m``.
        clients: The clients asked, ``n``.
        dropout: The tolerated dropout fraction ``xi``.
        noise: The noise kind.
        sigma: The total noise std the guarantee is computed for (the survivors'; grid units).
        epsilon: The evaluation's own epsilon at ``delta`` (for the noise the contributors added).
        delta: The delta.
        accountant: The accountant.
        neighbouring: The neighbouring relation of the guarantee.
        share: The evaluation's share of the selection's epsilon.
        composed_epsilon: The selection and this evaluation composed in RDP, at ``delta``: what DP-Hype released costs
            each client (``None`` until composed).
        run_epsilon: The whole run's epsilon at ``delta``: the selection, the DP training and this evaluation composed
            in RDP; ``None`` when the training was not private (no guarantee covers its plaintext updates).
    """

    accuracy: float
    majority_baseline: float
    noise_std: float
    contributors: int
    clients: int
    dropout: float
    noise: str
    sigma: float
    epsilon: float
    delta: float
    accountant: str
    neighbouring: str
    share: float
    composed_epsilon: float | None = None
    run_epsilon: float | None = None

    @property
    def below_baseline(self) -> bool:
        """Whether the released accuracy is below the released majority-class baseline."""
        return self.accuracy < self.majority_baseline

    def gap_std(self) -> float:
        """The std of the released accuracy minus the released baseline (independent noise: ``sqrt(2)`` times)."""
        return math.sqrt(2.0) * self.noise_std

    def verdict(self) -> str | None:
        """One line when the pick trained a model below the majority class (the gap, its noise), else ``None``."""
        if not self.below_baseline:
            return None
        gap = self.accuracy - self.majority_baseline
        numbers = (f"held-out accuracy {self.accuracy:.3f} vs {self.majority_baseline:.3f} (gap {gap:+.3f}, noise std "
                   f"{self.gap_std():.3f}")
        if -gap > 2 * self.gap_std():
            return (f"the selected candidate trained a model BELOW the majority-class baseline: {numbers}, beyond 2 "
                    "noise std); federated training can fail with the candidates clients score best on their own rows: "
                    f"{COLLAPSE_GUIDE}")
        return (f"the released accuracy is below the released majority-class baseline, but the noise may explain it: "
                f"{numbers}, within 2 noise std; a larger evaluation share or more clients would tell)")

    def describe(self) -> str:
        """The release in one line: both means with their noise std, who contributed, the cost."""
        composed = [f"{label} {eps:.4g}" for label, eps in (("selection + evaluation", self.composed_epsilon),
                                                            ("whole run with DP training", self.run_epsilon))
                    if eps is not None]
        run = f"; composed epsilon: {', '.join(composed)}" if composed else ""
        return (f"private evaluation of the final model on {self.contributors} of {self.clients} clients' held-out "
                f"rows: accuracy {self.accuracy:.3f}, majority-class baseline {self.majority_baseline:.3f} (each +- "
                f"{self.noise_std:.3f} noise std); ({self.epsilon:.4g}, {self.delta:g})-DP per client "
                f"({self.neighbouring}, {self.accountant} accountant, {self.noise} noise, {self.share:g} of the "
                f"selection's epsilon){run}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict of all fields."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvaluationResult:
        """Rebuild `to_dict`'s record; `ValueError` naming a missing or unknown field."""
        names = {f.name for f in dataclasses.fields(cls)}
        if not set(data) <= names:
            raise ValueError(f"unknown evaluation fields: {', '.join(sorted(set(data) - names))}")
        try:
            return cls(**data)
        except TypeError as err:
            raise ValueError(f"the evaluation record is incomplete: {err}") from None


def release_evaluation(total: Any, contributors: int, *, sigma: float, clients: int, dropout: float, noise: str,
                       delta: float, accountant: str | None, neighbouring: str, share: float) -> EvaluationResult:
    """The released means from the secure sum's ``total`` of ``contributors`` clients (post-processing).

    Args:
        total: The decoded ``(2,)`` sum (grid units).
        contributors: The clients in the sum, at least ``ceil((1 - xi) n)`` (the caller's secure sum enforces it).
        sigma: The calibrated total std (any ``ceil((1 - xi) n)`` contributors carry it).
        clients: The clients asked, ``n``.
        dropout: The tolerated dropout ``xi``.
        noise: The noise kind.
        delta: The delta.
        accountant: The accountant.
        neighbouring: The neighbouring relation (the sensitivity is the same under both).
        share: The evaluation's share of the selection's epsilon.

    Returns:
        The released means, with their noise std and the epsilon of the noise actually summed.

    Raises:
        ValueError: ``total`` is not two finite numbers, or ``contributors`` is out of ``[1, clients]``.
    """
    summed = np.asarray(total, dtype=np.float64)
    if summed.shape != (len(EVALUATION_VALUES),) or not np.all(np.isfinite(summed)):
        raise ValueError(f"the evaluation sum must be {len(EVALUATION_VALUES)} finite numbers, got {total!r}")
    m = check_survivors(contributors, clients)
    actual = client_noise_std(sigma, clients, dropout) * math.sqrt(m)
    scale = evaluation_scale(noise)
    accountant = resolve_accountant(accountant, noise)
    return EvaluationResult(
        accuracy=float(summed[0] / (scale * m)), majority_baseline=float(summed[1] / (scale * m)),
        noise_std=actual / (scale * m), contributors=m, clients=clients, dropout=dropout, noise=noise,
        sigma=actual, epsilon=evaluation_epsilon(actual, delta, noise=noise, accountant=accountant), delta=delta,
        accountant=accountant, neighbouring=neighbouring, share=share)


def evaluation_budget(selection_epsilon: float, share: float) -> float:
    """The evaluation's epsilon: ``share`` of the selection's ``epsilon`` (checked)."""
    return check_epsilon(check_epsilon(selection_epsilon) * check_share(share))
