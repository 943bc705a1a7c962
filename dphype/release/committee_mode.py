"""The tally committee's modes: ballots a committee verifies under MPC, noise the committee makes."""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

import numpy as np

from dphype.privacy.winner import JointSampler
from dphype.release.base import Aggregator, OpenedT, ReleaseMode, ReleaseRequest
from dphype.secure.committee import client_sealed_shares


class CommitteeMode(ReleaseMode[list[bytes], OpenedT]):
    """The tally committee's modes: ballots the committee verifies, noise the committee makes.

    A client shares its ballot only; the committee's noise (`tally_noise`) is added in the MPC, which checks every
    ballot, adds the valid ones and opens only `opens`.
    """

    aggregator = Aggregator.COMMITTEE
    uses_committee = True
    #: What the committee opens.
    opens: ClassVar[str]

    def ballot(self, request: ReleaseRequest, scores: np.ndarray, *, maximize: bool,
               clipping_range: int | None = None, voter: str | None = None) -> list[bytes]:
        """The ballot, checked against the request's form, as Shamir shares of its bits sealed to each tally.

        No noise: the committee makes it. One ciphertext per tally in committee order, bound to the request's digest,
        the tally and ``voter`` (`dphype.secure.committee.client_sealed_shares`).

        Args:
            request: The approved request.
            scores: The client's scores, ``(p,)`` or ``(p, j)``.
            maximize: Whether a higher score is better.
            clipping_range: Unused.
            voter: The client's identity in its run (`dphype.secure.committee.voter_id`); required.

        Returns:
            The ciphertexts, one per tally.

        Raises:
            ValueError: Without a ``voter``, or for a ballot that breaks the form.
        """  # noqa: DOC502
        if not voter:
            raise ValueError("voter must be the client's identity in its run (dphype.secure.committee.voter_id)")
        cfg, p = request.config, len(request.candidates)
        form = self.ballot_form(cfg, p)
        votes = form.check(self.resolved_ballot(cfg, p).cast(scores, cfg.k, maximize=maximize), p)
        return client_sealed_shares(request.digest(), votes, request.tallies, voter, form.bits)

    @abstractmethod
    def tally_noise(self, request: ReleaseRequest) -> np.ndarray | JointSampler:
        """The committee's noise as one tally contributes it (`dphype.flower.tally_node`).

        Either the sampler the MPC draws the whole noise with, which no tally knows (`JointSampler`), or this tally's
        share from a fresh `dphype.privacy.noise.secure_generator`, such that any honest majority's shares
        (`dphype.privacy.noise.honest_tallies`) carry the release's guarantee.

        Args:
            request: The approved request.

        Returns:
            The sampler, or the int64 share (one entry per candidate).
        """
