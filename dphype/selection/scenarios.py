"""The planner's consensus scenarios: how much the clients agree, and the vote sums that follows from it.

A scenario is Section IV-B's loss model (`dphype.selection.loss_model.LossModel`) with a stated disagreement ``s``
(`CONSENSUS`: strong 0.25, moderate 0.5, weak 1) and a number of good candidates. The good candidates form a
neighbourhood of the public feature space (the ``|H_good|`` nearest to a random candidate), as good hyperparameters
do on real tasks, so the structure-aware rule meets the structure it exploits; the argmax does not depend on where
they are. A scenario is a model of data the planner cannot see, not a measurement of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dphype.checks import check_int, check_positive
from dphype.selection.loss_model import LossModel, ranking_prefix, vote_counts

if TYPE_CHECKING:
    from dphype.selection.candidates import FeatureSpace

#: client disagreement ``sigma_loss`` of the named consensus scenarios (loss gap between good and bad: 1)
CONSENSUS: dict[str, float] = {"strong": 0.25, "moderate": 0.5, "weak": 1.0}


@dataclass(frozen=True)
class Scenario:
    """A stated consensus scenario: ``num_good`` good candidates, client disagreement ``sigma_loss``.

    Attributes:
        name: The scenario's name (a `CONSENSUS` name, or ``sigma_loss=...``).
        num_good: The number of good candidates.
        sigma_loss: The clients' disagreement.
    """

    name: str
    num_good: int
    sigma_loss: float

    def loss_model(self, num_candidates: int) -> LossModel:
        """The loss model of this scenario over ``num_candidates`` candidates."""
        return LossModel(self.num_good, num_candidates, self.sigma_loss)


def scenario(num_candidates: int, consensus: str | float = "moderate", num_good: int | None = None) -> Scenario:
    """The scenario ``consensus`` with ``num_good`` good candidates.

    Args:
        num_candidates: The number ``p`` of candidates, at least 2.
        consensus: A name of `CONSENSUS` or a ``sigma_loss > 0``.
        num_good: The number of good candidates, in ``[1, p - 1]`` (default: 5 % of them, at least 1, as in
            Section IV-B's 5 of 100).

    Returns:
        The scenario.

    Raises:
        ValueError: For an unknown name, a non-positive ``sigma_loss`` or ``num_candidates``, or ``num_good`` out
            of range.
    """
    p = check_int("num_candidates", num_candidates, 2)
    if isinstance(consensus, str):
        if consensus not in CONSENSUS:
            raise ValueError(f"consensus must be one of {', '.join(CONSENSUS)} or a number > 0, got {consensus!r}")
        name, sigma_loss = consensus, CONSENSUS[consensus]
    else:
        sigma_loss = check_positive("consensus", consensus)
        name = f"sigma_loss={sigma_loss:g}"
    good = max(1, round(0.05 * p)) if num_good is None else num_good
    if isinstance(good, bool) or not isinstance(good, (int, np.integer)) or not 1 <= good < p:
        raise ValueError(f"num_good must be an integer in [1, {p - 1}] (fewer than the candidates), got {good!r}")
    return Scenario(name, int(good), sigma_loss)


def read_consensus(value: str) -> str | float:
    """A ``--consensus`` option as `scenario` takes it: a number (``sigma_loss``) if it parses as one, else a name."""
    try:
        parsed: str | float = float(value)
    except ValueError:
        parsed = value
    scenario(2, parsed, 1)
    return parsed


def _neighbourhoods(space: FeatureSpace | None, num_good: int, centres: np.ndarray) -> np.ndarray:
    """``(R, num_good)`` candidates nearest each centre (numeric distance plus differing categories; ties by index)."""
    if space is None or space.no_structure is not None:
        return np.broadcast_to(np.arange(num_good), (len(centres), num_good))
    diff = space.numeric[centres][:, None, :] - space.numeric[None, :, :]
    dist = (diff**2).sum(axis=2) + (space.categorical[centres][:, None, :] != space.categorical[None, :, :]).sum(axis=2)
    return np.argsort(dist, axis=1, kind="stable")[:, :num_good]


def simulate_votes(sc: Scenario, clients: int, ks: Sequence[int], num_candidates: int,
                   space: FeatureSpace | None, repetitions: int,
                   rng: np.random.Generator) -> tuple[dict[int, np.ndarray], np.ndarray]:
    """Noiseless vote sums ``{k: (R, p)}`` of ``clients`` clients under ``sc`` and the good masks ``(R, p)``.

    The loss model's labels (good ``0 .. g-1``) are placed on the candidates per repetition: the good ones on a
    neighbourhood of a random candidate, the bad ones on the others in random order (they are exchangeable).

    Args:
        sc: The scenario.
        clients: The number of voting clients.
        ks: The values of ``k``.
        num_candidates: The number ``p`` of candidates.
        space: The candidates' feature space (``None``: no structure).
        repetitions: The number ``R`` of repetitions.
        rng: The random generator.

    Returns:
        ``k`` -> the vote sums ``(R, p)``, and the good masks, bool ``(R, p)``.
    """
    model = sc.loss_model(num_candidates)
    depth = max([k for k in ks if k < num_candidates], default=1)
    prefix = ranking_prefix(model, repetitions * clients, depth, rng)
    counts = vote_counts(prefix, ks, repetitions, clients, num_candidates)
    good = _neighbourhoods(space, sc.num_good, rng.integers(0, num_candidates, repetitions))
    is_good = np.zeros((repetitions, num_candidates), dtype=bool)
    np.put_along_axis(is_good, good, True, axis=1)
    rest = np.argsort(np.where(is_good, -1.0, rng.random((repetitions, num_candidates))), axis=1)[:, sc.num_good:]
    place = np.concatenate([good, rest], axis=1)  # label j -> candidate place[r, j]
    out = {}
    for k, label_counts in counts.items():
        votes = np.zeros_like(label_counts)
        np.put_along_axis(votes, place, label_counts, axis=1)
        out[k] = votes
    return out, is_good



#: The winner release's remaining ties are broken under this many times the stated scenario's disagreement.
TIE_BREAK_DISAGREEMENT = 2.0


def tie_break_scenario(sc: Scenario) -> Scenario:
    """``sc`` with `TIE_BREAK_DISAGREEMENT` times its ``sigma_loss``: breaks the winner release's remaining ties."""
    return Scenario(f"{sc.name}, tie-break", sc.num_good, TIE_BREAK_DISAGREEMENT * sc.sigma_loss)

