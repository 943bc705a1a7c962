"""Vote requests as an honest (or a lying) server builds them, for the client-guard tests."""

from __future__ import annotations

from dataclasses import dataclass

from dphype.accounting import calibrate
from dphype.candidates import CandidateList, table_iii_grid


@dataclass(frozen=True)
class Config:
    """The announced budget of a request (the fields :func:`dphype.policy.check_vote_request` reads)."""

    epsilon: float
    delta: float
    k: int
    clients: int
    dropout: float = 0.0
    noise: str = "skellam"
    accountant: str | None = None


@dataclass(frozen=True)
class Request:
    candidates: CandidateList
    config: Config
    sigma: float


def make_request(
    epsilon: float = 1.0,
    delta: float = 1e-5,
    k: int = 5,
    clients: int = 50,
    dropout: float = 0.0,
    noise: str = "skellam",
    accountant: str | None = None,
    sigma: float | None = None,
    candidates: CandidateList | None = None,
) -> Request:
    """A request whose sigma is calibrated for the announced budget (as a server does), unless ``sigma`` is given."""
    candidates = table_iii_grid() if candidates is None else candidates
    if sigma is None:
        sigma = calibrate(epsilon, delta, k, num_candidates=len(candidates), accountant=accountant, noise=noise).sigma
    return Request(candidates, Config(epsilon, delta, k, clients, dropout, noise, accountant), sigma)
