"""The private evaluation's request, and what a node checks before it evaluates the final model and sends anything.

The server asks each client for its held-out accuracy and majority-class baseline (`dphype.privacy.evaluation`)
with an `EvaluationRequest`: the selection's configuration (its delta, clients, dropout, noise kind, accountant and
relation), the evaluation's share of the selection's epsilon, the calibrated ``sigma`` and the digest of the model to
evaluate. A node answers only what its own policy admits (`check_evaluation_request`, the vote's rules: threat model
2 of `dphype.node.policy`): the announced delta and epsilon against its limits, the fewest contributors against
``dphype-min-clients``, the epsilon of the noise the fewest contributors carry recomputed at its own delta,
accountant and relation against ``dphype-max-epsilon``, and the lifetime budget in its ledger
(`dphype.node.ledger.Ledger.check`, then ``spend`` before its masked values leave it). No Flower import here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dphype.checks import EPSILON_RTOL
from dphype.config import DPHypeConfig
from dphype.node.policy import NodePolicy, VoteGuarantee, check_clients_limit, check_delta_limit
from dphype.privacy.evaluation import (
    EVALUATION_VALUES,
    calibrate_evaluation,
    check_share,
    evaluation_budget,
    evaluation_epsilon,
)
from dphype.privacy.noise import client_noise_std, min_survivors
from dphype.protocol import config_from_record, config_record
from dphype.refusal import Refusal

#: Prefix of every key of an evaluation request record.
PREFIX = "dphype_evaluation."


@dataclass(frozen=True)
class EvaluationGuarantee(VoteGuarantee):
    """What one evaluation costs a node: a `dphype.node.policy.VoteGuarantee` whose ``k`` counts the values sent.

    ``k`` is ``len(EVALUATION_VALUES)`` (each value moves the sum by at most the grid's scale); the ledger records it
    as an evaluation (`dphype.node.ledger.LedgerEntry.release`).
    """


@dataclass(frozen=True)
class EvaluationRequest:
    """What the server asks every client for: its held-out accuracy and baseline, plus a noise share of ``sigma``.

    Attributes:
        config: The selection's configuration (delta, clients, dropout, noise, accountant, neighbouring).
        share: The evaluation's share of ``config.epsilon``, in ``(0, 1]``.
        sigma: The total noise std (grid units, `dphype.privacy.evaluation.evaluation_scale`).
        model: The SHA-256 hex digest of the model's arrays the clients evaluate.

    Raises:
        ValueError: A field is invalid.
    """

    config: DPHypeConfig
    share: float
    sigma: float
    model: str

    def __post_init__(self) -> None:
        if not isinstance(self.config, DPHypeConfig):
            raise ValueError(f"config must be a DPHypeConfig, got {type(self.config).__name__}")
        object.__setattr__(self, "share", check_share(self.share))
        if not (isinstance(self.sigma, (int, float)) and not isinstance(self.sigma, bool) and self.sigma > 0):
            raise ValueError(f"sigma must be a number > 0, got {self.sigma!r}")
        if not (isinstance(self.model, str) and len(self.model) == 64):
            raise ValueError("model must be the 64-hex-digit SHA-256 digest of the model's arrays")

    @property
    def epsilon(self) -> float:
        """The evaluation's announced epsilon: ``share`` of the selection's."""
        return evaluation_budget(self.config.epsilon, self.share)

    @property
    def min_survivors(self) -> int:
        """Fewest contributors whose shares still add up to ``sigma``: ``ceil((1 - xi) n)``."""
        return min_survivors(self.config.clients, self.config.dropout)

    def to_record(self) -> dict[str, Any]:
        """Flat scalar record (keys `PREFIX` + name) for a Flower ``ConfigRecord``."""
        return {PREFIX + "share": self.share, PREFIX + "sigma": float(self.sigma), PREFIX + "model": self.model,
                **config_record(self.config, PREFIX)}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> EvaluationRequest:
        """Parse `to_record`'s output; ``malformed_request`` (a `dphype.refusal.Refusal`) names a missing or bad key."""
        try:
            config = config_from_record(record, PREFIX)
            return cls(config, record[PREFIX + "share"], record[PREFIX + "sigma"], str(record[PREFIX + "model"]))
        except KeyError as err:
            raise Refusal("malformed_request", f"the evaluation request has no {err.args[0]!r}") from None
        except (TypeError, ValueError) as err:
            raise Refusal("malformed_request", str(err)) from None

    def digest(self) -> str:
        """SHA-256 of the canonical record, 64 hex characters: what the SecAgg+ round binds."""
        blob = json.dumps(self.to_record(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def model_digest(arrays: Sequence[np.ndarray]) -> str:
    """SHA-256 over every array's dtype, shape and bytes, in order: the model an `EvaluationRequest` names."""
    digest = hashlib.sha256()
    for array in arrays:
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype.str}{array.shape};".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def make_evaluation_request(config: DPHypeConfig, share: float, model: str) -> EvaluationRequest:
    """Calibrate ``sigma`` for ``share`` of ``config.epsilon`` at ``config.delta``, the config's noise and accountant.

    Args:
        config: The selection's configuration.
        share: The evaluation's share of its epsilon, in ``(0, 1]``.
        model: The model's digest (64 hex digits).

    Returns:
        The request.

    Raises:
        ValueError: ``share`` is out of ``(0, 1]``, or the noise cannot be calibrated.
    """  # noqa: DOC502
    epsilon = evaluation_budget(config.epsilon, share)
    sigma = calibrate_evaluation(epsilon, config.delta, noise=config.noise, accountant=config.accountant)
    return EvaluationRequest(config, share, sigma, model)


def check_evaluation_request(request: EvaluationRequest, policy: NodePolicy) -> EvaluationGuarantee:
    """Refuse an evaluation this node's policy does not admit, else its worst-case guarantee (module docstring).

    Args:
        request: The server's request.
        policy: This node's policy.

    Returns:
        The guarantee of the fewest contributors' noise, at this node's delta, accountant and relation.

    Raises:
        Refusal: ``policy_delta``, ``policy_epsilon``, ``policy_clients``, or ``noise_too_small`` when ``sigma`` gives
            more than the announced epsilon.
    """  # noqa: DOC502
    cfg = request.config
    check_delta_limit(cfg, policy)
    announced = request.epsilon
    if announced > policy.max_epsilon * (1 + EPSILON_RTOL):
        raise Refusal("policy_epsilon", f"announced evaluation epsilon {announced:.6g} is above this node's limit",
                      local=f"announced evaluation epsilon {announced:.6g} > dphype-max-epsilon="
                            f"{policy.max_epsilon:.6g}")
    survivors = check_clients_limit(cfg, policy)
    total_std = client_noise_std(request.sigma, cfg.clients, cfg.dropout) * survivors ** 0.5
    claimed = evaluation_epsilon(total_std, cfg.delta, noise=cfg.noise, accountant=cfg.accountant)
    if claimed > announced * (1 + EPSILON_RTOL):
        raise Refusal("noise_too_small", f"sigma {request.sigma:.6g} gives evaluation epsilon {claimed:.6g}, more than "
                      f"the announced {announced:.6g}")
    eps = evaluation_epsilon(total_std, policy.max_delta, noise=cfg.noise, accountant=policy.accountant)
    if eps > policy.max_epsilon * (1 + EPSILON_RTOL):
        raise Refusal("policy_epsilon", f"evaluation epsilon {eps:.4g} ({policy.neighbouring}) is above this node's "
                      "limit", local=f"evaluation epsilon {eps:.4g} at dphype-max-delta={policy.max_delta:.3g} "
                      f"({survivors} contributors) > dphype-max-epsilon={policy.max_epsilon:.6g}")
    return EvaluationGuarantee(noise=cfg.noise, k=len(EVALUATION_VALUES), total_std=total_std, survivors=survivors,
                               epsilon=eps, delta=policy.max_delta, neighbouring=policy.neighbouring)
