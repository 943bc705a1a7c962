"""DP-Hype on the server: one secure sum of noisy top-k votes, then the argmax.

This is the server half of DP-Hype's Algorithm 1 as a Flower adapter:

1. calibrate the total noise std ``sigma`` for ``(epsilon, delta, k)``
   (:func:`dphype.accounting.calibrate`, Thm I.1 / analytic Gaussian / Skellam RDP);
2. send every one of the ``n`` clients a :class:`VoteRequest` (candidate-list
   fingerprint, ``k``, ``sigma``, ``n``, dropout tolerance ``xi``, noise kind and the
   budget, so that clients can check the noise they are asked to add);
3. receive the exact sum of ``votes + noise share`` over SecAgg+ in one round
   (:mod:`dphype.secure_sum`; the server never sees a single client's vector and
   never adds noise itself), refusing to unmask it if fewer than
   ``ceil((1 - xi) n)`` clients contributed;
4. release ``argmax`` of the noisy sum (line 12, :func:`dphype.voting.select`)
   with a :class:`dphype.accounting.PrivacyReport`.

Use :func:`run_dphype` inside your own ``ServerApp`` ``@app.main()``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Context
from flwr.common import Scalar
from flwr.serverapp.grid import Grid

from dphype.accounting import (
    PrivacyReport,
    VoteRelease,
    calibrate,
    check_budget,
    check_noise,
    check_sigma,
    privacy_report,
    resolve_accountant,
)
from dphype.candidates import Candidate, CandidateList
from dphype.noise import min_survivors
from dphype.secure_sum import (
    GAUSSIAN_SCALE,
    PHASE_KEY,
    VOTE_PHASE,
    SecureSumStrategy,
    check_clients,
    check_range,
    run_secure_sum,
)
from dphype.voting import select

_PREFIX = "dphype."


@dataclass(frozen=True)
class VoteRequest:
    """What the server asks every client for: one noisy top-k vote vector.

    Sent as the fit config of the SecAgg+ round. ``sigma`` is the TOTAL noise std
    on the released sum; each client adds a share of variance
    ``sigma^2 / ((1 - dropout) clients)``. ``epsilon``, ``delta`` and ``accountant``
    let a client verify that ``sigma`` really gives the promised guarantee.
    """

    fingerprint: str
    num_candidates: int
    k: int
    sigma: float
    clients: int
    dropout: float
    noise: str
    epsilon: float
    delta: float
    accountant: str

    def __post_init__(self) -> None:
        check_budget(
            self.epsilon,
            self.delta,
            self.k,
            num_candidates=self.num_candidates,
            clients=self.clients,
            dropout=self.dropout,
        )
        check_clients(self.clients)
        check_sigma(self.sigma)
        resolve_accountant(self.accountant, check_noise(self.noise))

    @property
    def release(self) -> VoteRelease:
        """The release this request describes, for accounting."""
        return VoteRelease(
            k=self.k, num_candidates=self.num_candidates, sigma=self.sigma, noise=self.noise
        )

    def to_config(self) -> dict[str, Scalar]:
        """Flower fit config (flat scalars, keys prefixed ``dphype.``), marked as a vote request."""
        config: dict[str, Scalar] = {
            _PREFIX + name: value for name, value in self.__dict__.items()
        }
        config[PHASE_KEY] = VOTE_PHASE
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> VoteRequest:
        """Parse a fit config; raises ``ValueError`` if it is not a complete vote request."""
        if config.get(PHASE_KEY) != VOTE_PHASE:
            raise ValueError(
                f"fit config is not a DP-Hype vote request ({PHASE_KEY}={config.get(PHASE_KEY)!r})"
            )
        names = cls.__dataclass_fields__
        missing = [name for name in names if _PREFIX + name not in config]
        if missing:
            raise ValueError(f"vote request is missing {', '.join(_PREFIX + m for m in missing)}")
        return cls(**{name: config[_PREFIX + name] for name in names})


@dataclass(frozen=True)
class DPHypeResult:
    """Outcome of one DP-Hype selection: the winner, the released noisy sum, the privacy report."""

    selected_index: int
    selected: Candidate
    noisy_sum: np.ndarray
    report: PrivacyReport

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly summary."""
        return {
            "selected_index": self.selected_index,
            "selected": dict(self.selected),
            "noisy_sum": self.noisy_sum.tolist(),
            "privacy": self.report.to_dict(),
        }


class DPHypeStrategy(SecureSumStrategy):
    """Legacy Flower strategy for DP-Hype's single SecAgg+ voting round.

    Sends ``request`` to all ``request.clients`` clients, decodes the exact noisy
    vote sum of the survivors and stores :attr:`result` (argmax + privacy report).
    """

    def __init__(
        self,
        candidates: CandidateList,
        request: VoteRequest,
        *,
        connect_timeout: float = 600.0,
    ) -> None:
        candidates.check_fingerprint(request.fingerprint)
        if len(candidates) != request.num_candidates:
            raise ValueError(
                f"num_candidates must equal len(candidates)={len(candidates)}, "
                f"got {request.num_candidates}"
            )
        super().__init__(
            clients=request.clients,
            size=request.num_candidates,
            noise=request.noise,
            min_survivors=min_survivors(request.clients, request.dropout),
            fit_config=request.to_config(),
            connect_timeout=connect_timeout,
        )
        self.candidates = candidates
        self.request = request
        self.result: DPHypeResult | None = None

    def on_sum(self, total: np.ndarray, survivors: int) -> None:
        """Select the argmax of the noisy sum and account for the release."""
        index = select(total)
        report = privacy_report(
            self.request.release,
            self.request.delta,
            clients=self.request.clients,
            dropout=self.request.dropout,
            survivors=survivors,
            accountant=self.request.accountant,
        )
        if self.request.noise == "gaussian":
            report = dataclasses.replace(
                report,
                released=f"{report.released}; Gaussian shares rounded to a 1/{GAUSSIAN_SCALE} "
                "grid before summation, so the guarantee is approximate",
            )
        self.result = DPHypeResult(
            selected_index=index,
            selected=self.candidates[index],
            noisy_sum=total,
            report=report,
        )


def make_vote_request(
    candidates: CandidateList,
    *,
    epsilon: float,
    delta: float,
    k: int,
    clients: int,
    dropout: float = 0.0,
    noise: str = "skellam",
    accountant: str | None = None,
) -> VoteRequest:
    """Validate a DP-Hype configuration and calibrate its noise (Algorithm 1, line 1).

    Raises ``ValueError`` for a bad budget, ``k`` outside ``[1, p]``, fewer than 2 or
    more than :data:`dphype.secure_sum.MAX_CLIENTS` clients, a dropout outside
    ``[0, 1)``, an unknown noise kind or accountant, or a ``sigma`` that SecAgg+
    could clip (:func:`dphype.secure_sum.check_range`).
    """
    if not isinstance(candidates, CandidateList):
        raise ValueError(f"candidates must be a CandidateList, got {type(candidates).__name__}")
    check_budget(epsilon, delta, k, num_candidates=len(candidates), clients=clients, dropout=dropout)
    check_clients(clients)
    accountant = resolve_accountant(accountant, check_noise(noise))
    release = calibrate(
        epsilon, delta, k, num_candidates=len(candidates), accountant=accountant, noise=noise
    )
    check_range(
        size=len(candidates), sigma=release.sigma, clients=clients, dropout=dropout, noise=noise
    )
    return VoteRequest(
        fingerprint=candidates.fingerprint(),
        num_candidates=len(candidates),
        k=int(k),
        sigma=release.sigma,
        clients=int(clients),
        dropout=float(dropout),
        noise=noise,
        epsilon=float(epsilon),
        delta=float(delta),
        accountant=accountant,
    )


def run_dphype(
    grid: Grid,
    context: Context,
    candidates: CandidateList,
    *,
    epsilon: float,
    delta: float,
    k: int,
    clients: int,
    dropout: float = 0.0,
    noise: str = "skellam",
    accountant: str | None = None,
    timeout: float | None = None,
    connect_timeout: float = 600.0,
    num_shares: float | None = None,
    reconstruction_threshold: float = 0.6,
) -> DPHypeResult:
    """Run DP-Hype's selection inside a ServerApp and return the winner with its privacy report.

    Parameters
    ----------
    grid, context:
        The ``Grid`` and ``Context`` your ``@app.main()`` receives.
    candidates:
        The public, ordered candidate list; every client must hold the same list
        (checked by fingerprint).
    epsilon, delta:
        Privacy budget of the released noisy vote sum (and hence of the argmax).
    k:
        Votes per client (Algorithm 1).
    clients:
        Number of clients ``n`` that must take part; the round waits (up to
        ``connect_timeout`` seconds) until ``n`` nodes are connected.
    dropout:
        Tolerated dropout fraction ``xi`` (Appendix A): clients scale their noise
        so that any ``ceil((1 - xi) n)`` survivors carry the full noise. With fewer
        survivors nothing is released and :class:`dphype.secure_sum.TooFewSurvivorsError`
        is raised.
    noise:
        ``"skellam"`` (integer, exact under SecAgg+; default) or ``"gaussian"``
        (sent on a 2**-10 fixed-point grid: its guarantee is approximate).
    accountant:
        ``"rdp"`` or ``"analytic"`` (Gaussian only); ``None`` picks the default.
    timeout:
        Seconds to wait for replies in each SecAgg+ stage (``None``: no limit). Set it
        in deployments: a SuperNode that disappears is then counted as dropped out
        (see ``dropout``) instead of stalling the round forever.
    num_shares, reconstruction_threshold:
        SecAgg+ parameters (fractions); see :func:`dphype.secure_sum.default_num_shares`.
    """
    request = make_vote_request(
        candidates,
        epsilon=epsilon,
        delta=delta,
        k=k,
        clients=clients,
        dropout=dropout,
        noise=noise,
        accountant=accountant,
    )
    strategy = DPHypeStrategy(candidates, request, connect_timeout=connect_timeout)
    run_secure_sum(
        grid,
        context,
        strategy,
        num_shares=num_shares,
        reconstruction_threshold=reconstruction_threshold,
        timeout=timeout,
    )
    assert strategy.result is not None  # run_secure_sum raises when no sum was decoded
    return strategy.result

