"""One misbehaving contributor costs its own ballot, never the release: every way its shares can fail at the tallies
(framework-free: `Tally` and the MPyC parties on loopback) ends with it left out at every tally and named, and the
committee opens the other ballots' result when enough of them remain (`min_valid_ballots`)."""

import numpy as np
import pytest

from dphype.privacy.noise import min_survivors, min_valid_ballots
from dphype.secure.committee import (
    OPENS_SUM,
    Tally,
    TallyError,
    client_sealed_shares,
    field_modulus,
    run_loopback_committee,
    share_context,
    split_shares,
    voter_id,
)
from dphype.secure.relay import seal
from dphype.selection.ballots import BallotForm

SIZE, VOTERS, REQUEST = 5, 10, "req-x"
FORM = BallotForm.top_k(1)


def honest_ballots() -> list[np.ndarray]:
    """10 top-1 ballots: 6 for candidate 3, 4 for candidate 1 (the sum 0 4 0 6 0)."""
    return [np.eye(SIZE, dtype=np.int64)[3 if i < 6 else 1] for i in range(VOTERS)]


def committee(opens="argmax") -> list[Tally]:
    tallies = [Tally(j) for j in range(3)]
    for t in tallies:  # no noise: the opened value is known exactly
        t.open_round(REQUEST, SIZE, min_valid_ballots(VOTERS, 0.0), form=FORM, noise=np.zeros(SIZE, dtype=np.int64),
                     opens=opens)
    return tallies


def sealed_row(keys, shares, voter):
    return [seal(key, np.asarray(share, dtype=np.uint64).tobytes(), context=share_context(REQUEST, j, voter))
            for j, (key, share) in enumerate(zip(keys, shares, strict=True))]


def bad_to_one_tally(keys, voter):
    """(a) valid shares to tallies 0 and 1, bytes that do not open to tally 2."""
    good = client_sealed_shares(REQUEST, np.eye(SIZE, dtype=np.int64)[0], keys, voter)
    return [good[0], good[1], bytes(len(good[2]))]


def under_another_label(keys, voter):
    """(b) shares sealed under another member's label (voter-1's), relayed as its own."""
    return client_sealed_shares(REQUEST, np.eye(SIZE, dtype=np.int64)[0], keys, voter_id(0, "voter-1"))


def boosted(keys, voter):
    """Invalid content: 4 votes for candidate 0 in a top-1 ballot, dealt and sealed correctly."""
    ballot = np.zeros(SIZE, dtype=np.int64)
    ballot[0] = 4
    return sealed_row(keys, split_shares(ballot, 3, field_modulus()), voter)


def two_ballots(keys, voter):
    """Different ballots to different tallies: shares of candidate 0's ballot to tallies 0 and 1, of candidate 4's
    to tally 2 (each alone a valid sharing; together on no line)."""
    q = field_modulus()
    a, b = (split_shares(np.eye(SIZE, dtype=np.int64)[c], 3, q) for c in (0, 4))
    return sealed_row(keys, [a[0], a[1], b[2]], voter)


def wrong_length(keys, voter):
    """A share that opens but does not parse (a ballot over 4 candidates) at every tally."""
    return client_sealed_shares(REQUEST, np.eye(4, dtype=np.int64)[0], keys, voter)


ATTACKS = {"bytes that do not open at one tally": bad_to_one_tally, "another member's label": under_another_label,
           "invalid content": boosted, "different ballots to different tallies": two_ballots,
           "a share that does not parse": wrong_length}


def cast(tallies, cheaters):
    """The 10 honest voters, and after them each cheater ``name -> attack``; returns the honest ballots' sum."""
    keys = [t.public for t in tallies]
    ballots = honest_ballots()
    rows = {f"voter-{i}": client_sealed_shares(REQUEST, b, keys, voter_id(0, f"voter-{i}"))
            for i, b in enumerate(ballots)}
    rows |= {name: attack(keys, voter_id(0, name)) for name, attack in cheaters.items()}
    for name, row in rows.items():
        for t, share in zip(tallies, row, strict=True):
            t.receive(name, share)
    return np.sum(ballots, axis=0)


def test_the_committee_floor_tolerates_one_misbehaving_member_in_ten_beyond_the_dropout():
    assert [min_valid_ballots(n, 0.0) for n in (2, 9, 10, 11, 20, 100)] == [1, 8, 9, 9, 18, 90]
    assert min_valid_ballots(20, 0.1) == min_survivors(20, 0.1) - 2 == 16
    assert min_valid_ballots(3, 0.5) == 1  # never below one ballot
    with pytest.raises(ValueError, match="dropout"):
        min_valid_ballots(10, 1.0)


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_one_misbehaving_contributor_is_left_out_at_every_tally_and_named_and_the_release_goes_on(attack):
    """The cheater is the 11th contributor of 10 honest ones (floor 9 of 10 clients): it is excluded everywhere,
    even where its share looked fine, and the committee opens the honest ballots' sum (argmax: candidate 3)."""
    tallies = committee(opens=OPENS_SUM)
    counts = cast(tallies, {"mallory": ATTACKS[attack]})
    jobs = [t.job() for t in tallies]
    local = [set(job["invalid"]) for job in jobs]
    if attack == "bytes that do not open at one tally":  # only tally 2 saw it: the MPC leaves it out at all three
        assert local == [set(), set(), {0}]  # "mallory" comes first of the labels
    opening = run_loopback_committee(jobs)
    assert opening.excluded == ("mallory",) and opening.excluded_at == (0,)
    assert opening.value == tuple(counts.tolist())  # exactly the honest ballots, nothing of the cheater's


def test_misbehaving_contributors_beyond_the_floor_release_nothing_and_are_named():
    """Two of 10 voters misbehave (8 valid ballots, floor 9): the committee opens nothing and names both."""
    tallies = committee()
    keys = [t.public for t in tallies]
    ballots = honest_ballots()
    for i, ballot in enumerate(ballots):
        row = (bad_to_one_tally if i == 0 else boosted if i == 1 else
               lambda k, v, b=ballot: client_sealed_shares(REQUEST, b, k, v))(keys, voter_id(0, f"voter-{i}"))
        for t, share in zip(tallies, row, strict=True):
            t.receive(f"voter-{i}", share)
    with pytest.raises(TallyError, match=r"only 8 valid ballots, fewer than the committee's minimum 9 \(2 invalid\) "
                                         r"\(invalid ballots from contributors voter-0, voter-1\)") as err:
        run_loopback_committee([t.job() for t in tallies])
    assert err.value.excluded == ("voter-0", "voter-1")


def test_a_collect_a_tally_cannot_count_is_refused_before_it_counts_as_served_and_a_smaller_retry_is_served():
    """A tally that takes fewer shares than the floor refuses the round before the request counts as served (the
    MPC never ran, nothing was opened): the same tally serves the same request in the same run over a different set
    (here without the shares it could not open); once that job left, the request is served and refused again."""
    tally = Tally(0)
    others = [Tally(1), Tally(2)]
    keys = [tally.public] + [t.public for t in others]
    tally.open_round(REQUEST, SIZE, 9, form=FORM, noise=np.zeros(SIZE))
    rows = {f"voter-{i}": client_sealed_shares(REQUEST, b, keys, voter_id(0, f"voter-{i}"))[0]
            for i, b in enumerate(honest_ballots())}
    for i, (name, share) in enumerate(rows.items()):
        tally.receive(name, share if i >= 2 else bytes(len(share)))  # two shares that do not open: 8 < 9
    with pytest.raises(TallyError, match="takes only 8 of 10 shares, under the committee's minimum 9; "
                                         "nothing released\nleft out first: voter-0, its share is not this "
                                         "contributor's"):
        tally.job()
    tally.open_round(REQUEST, SIZE, 8, form=FORM, noise=np.zeros(SIZE))  # not served: the retry is collected
    for name, share in list(rows.items())[2:]:
        tally.receive(name, share)
    assert tally.job()["contributors"] == [f"voter-{i}" for i in range(2, VOTERS)]
    with pytest.raises(TallyError, match="refuses a second opening"):
        tally.open_round(REQUEST, SIZE, 7, form=FORM, noise=np.zeros(SIZE))


def test_a_party_that_fails_logs_its_stderr_and_names_its_last_words(caplog):
    """A party's stderr reaches the host's log (one record per line) and the error names its last line: here a job
    that does not parse makes every party stop with a traceback."""
    tallies = committee()
    cast(tallies, {})
    jobs = [t.job() for t in tallies]
    for job in jobs:
        job["shares"] = "not base64 of a share row!"
    with caplog.at_level("WARNING", logger="dphype.secure.committee"), \
            pytest.raises(TallyError, match=r"tally 0 stopped without an answer \(exit code 1\) \(its last words: "
                                            r"ValueError: buffer size must be a multiple"):
        run_loopback_committee(jobs, timeout=60)
    assert any(r.getMessage().startswith("tally 0 party: Traceback") for r in caplog.records)


def test_a_row_one_tally_flags_and_the_others_do_not_is_left_out_at_every_party():
    """White-box, the flags alone: tally 1 marks voter-0's perfectly valid sharing as not taken (its
    reason is its own), the others took it. Each party must combine every tally's flags by union, its own included:
    the ballot is left out everywhere (one set counted) and named. By intersection, or a party ignoring its own
    tally's flags, it would count (6 votes for candidate 3, not 5)."""
    tallies, flagging = committee(opens=OPENS_SUM), 1
    counts = cast(tallies, {})
    jobs = [t.job() for t in tallies]
    position = jobs[flagging]["contributors"].index("voter-0")
    jobs[flagging]["invalid"], jobs[flagging]["reasons"] = [position], ["flagged by its tally only"]
    opening = run_loopback_committee(jobs)
    assert opening.excluded == ("voter-0",) and opening.excluded_at == (position,)
    assert opening.value == tuple((counts - np.eye(SIZE, dtype=np.int64)[3]).tolist())
