"""The ballot form: what every client's ballot must be (dphype.selection.ballots)."""

from __future__ import annotations

import numpy as np
import pytest

from dphype.release import release_modes
from dphype.selection.ballots import BallotForm, InvalidBallot
from dphype.selection.voting import top_k_votes


def test_top_k_form_accepts_every_top_k_ballot_and_nothing_else():
    form = BallotForm.top_k(3)
    assert (form.max_entry, form.min_total, form.max_total, form.bits) == (1, 3, 3, 1)
    rng = np.random.default_rng(0)
    for _ in range(20):
        ballot = top_k_votes(rng.normal(size=10), 3)
        assert np.array_equal(form.check(ballot, 10), ballot)
    with pytest.raises(InvalidBallot, match=r"total must lie in \[3, 3\]"):
        form.check([1, 1, 0, 0])  # two ones
    with pytest.raises(InvalidBallot, match=r"total must lie in \[3, 3\]"):
        form.check([1, 1, 1, 1])  # four ones
    with pytest.raises(InvalidBallot, match=r"entries must lie in \[0, 1\]"):
        form.check([2, 1, 0, 0])  # total 3, but an entry of 2
    with pytest.raises(InvalidBallot, match=r"entries must lie in \[0, 1\]"):
        form.check([-1, 1, 1, 1, 1])  # total 3, but an entry of -1
    with pytest.raises(InvalidBallot, match="one entry per candidate"):
        form.check([1, 1, 1], 4)
    with pytest.raises(InvalidBallot, match="integers"):
        form.check([0.5, 0.5, 1, 1])


def test_graded_form_bounds_are_inclusive():
    form = BallotForm(7, 2, 10)
    assert form.bits == 3
    form.check([7, 3, 0])  # total 10: the upper bound
    form.check([2, 0, 0])  # total 2: the lower bound
    with pytest.raises(InvalidBallot):
        form.check([8, 0, 0])
    with pytest.raises(InvalidBallot):
        form.check([7, 4, 0])  # total 11
    with pytest.raises(InvalidBallot):
        form.check([1, 0, 0])  # total 1


@pytest.mark.parametrize(("args", "match"), [
    ((0, 0, 0), "max_entry must be 2\\*\\*bits - 1"),
    ((2, 0, 1), "max_entry must be 2\\*\\*bits - 1"),
    ((6, 0, 1), "max_entry must be 2\\*\\*bits - 1"),
    ((1, 3, 2), "min_total <= max_total"),
    ((1, -1, 2), "min_total <= max_total"),
    ((True, 1, 1), "must be an integer"),
])
def test_form_refuses_invalid_bounds(args, match):
    with pytest.raises(ValueError, match=match):
        BallotForm(*args)


def test_form_as_json_values():
    form = BallotForm(15, 0, 40)
    assert form.to_dict() == {"max_entry": 15, "min_total": 0, "max_total": 40}


def test_every_mode_derives_top_k_form_from_its_config():
    class Config:
        k = 4
        ballot = "top-k"

    for mode in release_modes():
        assert mode.ballot_form(Config()) == BallotForm.top_k(4)
