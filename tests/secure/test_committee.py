"""The tally committee: sealed Shamir shares of ballots, per-tally checks, and the secure argmax on MPyC (3 local
parties). The tallies' noise shares are given (zero, or fixed vectors) so that the opened value is known exactly;
tests/secure/test_ballot_check.py checks the ballots, tests/privacy the noise the modes draw."""

import base64

import numpy as np
import pytest

from dphype.secure.committee import (
    OPENS_ARGMAX,
    OPENS_SUM,
    Opening,
    ServedRecord,
    Tally,
    TallyError,
    check_committee,
    client_sealed_shares,
    field_modulus,
    open_shares,
    run_loopback_committee,
    split_shares,
    voter_id,
)
from dphype.selection.ballots import BallotForm

TOP_1 = BallotForm.top_k(1)


def committee(min_contributors, request="req-1", size=5, k=1, noise=None, opens=OPENS_ARGMAX):
    tallies = [Tally(j) for j in range(3)]
    for t in tallies:
        share = np.zeros(size, dtype=np.int64) if noise is None else noise[t.index]
        t.open_round(request, size, min_contributors, form=BallotForm.top_k(k), noise=share, opens=opens)
    return tallies


def one_hot(size, *indices):
    ballot = np.zeros(size, dtype=np.int64)
    ballot[list(indices)] = 1
    return ballot


def send(tallies, request, vectors, start=0, deliver=3):
    keys = [t.public for t in tallies]
    for c, vec in enumerate(vectors, start=start):
        sealed = client_sealed_shares(request, vec, keys, voter_id(0, f"client-{c}"))
        for t, share in list(zip(tallies, sealed, strict=True))[:deliver]:
            t.receive(f"client-{c}", share)


def test_shamir_shares_open_from_any_two_tallies_and_one_share_is_uniform():
    q = field_modulus()
    assert q.bit_length() == 64 and q % 4 == 3
    values = np.array([-3, 0, 7, 2**31 - 1])
    shares = split_shares(values, 3, q)
    for pair in ((0, 1), (0, 2), (1, 2)):  # threshold 1: any two of three reconstruct
        assert open_shares({j: shares[j] for j in pair}, q) == values.tolist()
    # independent check of the degree-1 sharing: the shares lie on a line through (0, value)
    assert all((2 * a - b - v) % q == 0 for a, b, v in zip(shares[0], shares[1], values.tolist(), strict=True))
    # one share of a constant vector is uniform on GF(q): its top bit is a fair coin
    bits = [split_shares(np.zeros(1, dtype=int), 3, q)[0][0] >> 63 for _ in range(4000)]
    assert 0.45 < np.mean(bits) * (2**64 / q) < 0.55


def test_the_loopback_committee_on_valid_ballots_opens_the_lowest_index_among_ties():
    tallies = committee(2, size=6, k=2)
    send(tallies, "req-1", [one_hot(6, 1, 3), one_hot(6, 1, 4), one_hot(6, 3, 4)])  # counts 0 2 0 2 2 0
    assert run_loopback_committee([t.job() for t in tallies]) == Opening(1, ())
    rng = np.random.default_rng(7)
    ballots = [one_hot(100, *rng.choice(100, 3, replace=False)) for _ in range(40)]
    tallies = committee(4, request="req-2", size=100, k=3)
    send(tallies, "req-2", ballots)
    assert run_loopback_committee([t.job() for t in tallies]) == Opening(int(np.argmax(np.sum(ballots, axis=0))), ())


def test_every_tallys_noise_share_is_added_and_the_committee_opens_the_argmax_or_the_whole_noisy_sum():
    ballots = [one_hot(6, 1, 3), one_hot(6, 1, 4), one_hot(6, 3, 4)]  # counts 0 2 0 2 2 0
    noise = [np.array([0, -1, 0, 0, 2, 0]), np.array([5, 0, 0, 0, -1, 0]), np.array([-4, 0, 0, 1, 0, -7])]
    noisy = np.sum(ballots, axis=0) + np.sum(noise, axis=0)  # 1 1 0 3 3 -7
    tallies = committee(3, size=6, k=2, noise=noise)
    send(tallies, "req-1", ballots)
    assert run_loopback_committee([t.job() for t in tallies]) == Opening(3, ())  # 3 and 4 tie: the lower index
    tallies = committee(3, request="req-2", size=6, k=2, noise=noise, opens=OPENS_SUM)
    send(tallies, "req-2", ballots)
    assert run_loopback_committee([t.job() for t in tallies]) == Opening(tuple(noisy.tolist()), ())
    with pytest.raises(ValueError, match="the noise must have 6 entries and opens must be"):
        Tally(0).open_round("req-3", 6, 1, form=TOP_1, noise=np.zeros(5))
    with pytest.raises(ValueError, match="the noise must have 6 entries and opens must be"):
        Tally(0).open_round("req-3", 6, 1, form=TOP_1, noise=np.zeros(6), opens="median")


def test_tallies_refuse_too_few_contributors_and_disagreeing_sets():
    tallies = committee(3)
    send(tallies, "req-1", [one_hot(5, 0)] * 2)
    with pytest.raises(TallyError, match="tally 0 takes only 2 of 2 shares, under the committee's minimum 3; "
                                         "nothing released"):
        tallies[0].job()
    tallies[0].open_round("req-1", 5, 3, form=TOP_1, noise=np.zeros(5))  # refused before it counted as served
    tallies = committee(2)
    send(tallies, "req-1", [one_hot(5, 0)] * 2)
    send(tallies, "req-1", [one_hot(5, 1)], start=5, deliver=2)  # tally 2 never got client-5's share
    with pytest.raises(TallyError, match="tallies disagree on the contributor set"):
        run_loopback_committee([t.job() for t in tallies])


def test_a_missing_tally_releases_nothing_and_names_the_tally():
    tallies = committee(1)
    send(tallies, "req-1", [one_hot(5, 2)])
    jobs = [t.job() for t in tallies]
    # the error names the wait allowed (1 s), not what was left of it when tally 0's turn came (0.99999... s)
    with pytest.raises(TallyError, match=r"did not answer within 1 s; nothing released \(tally 2 did not start\)"):
        run_loopback_committee([jobs[0], jobs[1], None], timeout=1.0)


def test_tally_marks_replays_foreign_shares_and_duplicates_invalid():
    """Each share that fails is kept as an invalid entry with its reason (the MPC leaves its ballot out), never a
    refusal of the whole round: the same label twice (both), another tally's, request's or contributor's share, and
    one of the wrong length."""
    tallies = committee(1)
    keys = [t.public for t in tallies]
    sealed = client_sealed_shares("req-1", one_hot(5, 4), keys, voter_id(0, "a"))
    tallies[0].receive("a", sealed[0])
    tallies[0].receive("a", client_sealed_shares("req-1", one_hot(5, 1), keys, voter_id(0, "a"))[0])
    assert tallies[0].invalid() == {0: "the same contributor sent twice (2 entries)",
                                    1: "the same contributor sent twice (2 entries)"}
    tallies[1].receive("a", sealed[0])  # tally 0's share at tally 1
    tallies[1].receive("c", client_sealed_shares("req-other", one_hot(5, 4), keys, voter_id(0, "c"))[1])
    assert list(tallies[1].invalid()) == [0, 1]
    assert all("not this contributor's for request req-1, this run and this tally" in reason
               for reason in tallies[1].invalid().values())
    # a share of the wrong length is the client's doing too
    tallies[2].receive("e", client_sealed_shares("req-1", one_hot(5, 3), keys, voter_id(0, "e"))[2])
    tallies[2].receive("d", client_sealed_shares("req-1", one_hot(4, 3), keys, voter_id(0, "d"))[2])
    job = tallies[2].job()
    assert (job["contributors"], job["invalid"]) == (["d", "e"], [0]) and "does not parse" in job["reasons"][0]
    tallies[0].receive("b", client_sealed_shares("req-1", one_hot(5, 2), keys, voter_id(0, "b"))[0])
    assert tallies[0].job()["invalid"] == [0, 1]  # a, a; b counts
    with pytest.raises(TallyError, match="refuses a second opening for request req-1"):
        tallies[0].open_round("req-1", 5, 1, form=TOP_1, noise=np.zeros(5))
    with pytest.raises(TallyError, match="tally 0 has no open request"):
        tallies[0].receive("e", sealed[0])


def test_one_ballot_relabelled_as_many_contributors_is_refused_by_identity_and_by_content():
    """One ballot counted many times: the server relays one client's sealed shares under ten labels.
    A share is bound to its contributor (and run), so under another label it does not open; the same bytes twice
    are refused by content too, whatever the label."""
    tallies = committee(1)
    keys = [t.public for t in tallies]
    sealed = client_sealed_shares("req-1", one_hot(5, 0), keys, voter_id(0, "7"))
    for t, share in zip(tallies, sealed, strict=True):
        for label in range(8, 17):
            t.receive(str(label), share)
        t.receive("7", share)
    jobs = [t.job() for t in tallies]
    labels = sorted(str(label) for label in range(7, 17))
    assert [job["contributors"] for job in jobs] == [labels] * 3
    relabelled = [i for i, label in enumerate(labels) if label != "7"]
    assert [job["invalid"] for job in jobs] == [relabelled] * 3  # every relabelled copy, never the ballot
    assert all("is not this contributor's" in reason for job in jobs for reason in job["reasons"])
    opening = run_loopback_committee(jobs)
    assert (opening.value, opening.excluded) == (0, tuple(labels[i] for i in relabelled))
    with pytest.raises(ValueError, match="non-empty without ';' or '|'"):
        voter_id(0, "7;voter=8")


def test_a_tallys_record_refuses_a_request_served_in_that_run_across_restarts_and_other_runs_do_not_open(tmp_path):
    """Replay to the tallies in a later run: what a tally served is on disk beside its key, read before
    it opens anything, so a restarted tally (a fresh process, empty context) refuses the same request in the same
    run; the same ciphertexts in a new run do not open (they are bound to their run)."""
    record = ServedRecord(tmp_path / "tally-0.key.served")
    first = Tally(0, record=record)
    keys = [first.public, Tally(1).public, Tally(2).public]
    sealed = client_sealed_shares("req-1", one_hot(5, 0), keys, voter_id(41, "3"))
    form = BallotForm.top_k(1)
    first.open_round("req-1", 5, 1, run=41, form=form, noise=np.zeros(5))
    first.receive("3", sealed[0])
    first.job()
    assert record.entries() == {(41, "req-1")}
    assert record.path.stat().st_mode & 0o777 == 0o600
    restarted = Tally(0, first.keys, record=ServedRecord(record.path))  # nothing in memory: the file decides
    with pytest.raises(TallyError, match="refuses a second opening for request req-1"):
        restarted.open_round("req-1", 5, 1, run=41, form=form, noise=np.zeros(5))
    # a new run may ask again (its clients vote and pay again) ...
    restarted.open_round("req-1", 5, 1, run=42, form=form, noise=np.zeros(5))
    restarted.receive("3", sealed[0])  # ... but the old ciphertexts do not open in it
    assert "not this contributor's for request req-1, this run" in restarted.invalid()[0]
    record.path.write_text('{"run": 41, "request": "req-1"}\nnot json\n')
    with pytest.raises(TallyError, match="cannot be read: repair it"):
        Tally(0, first.keys, record=record).open_round("req-2", 5, 1, run=43, form=form, noise=np.zeros(5))


def test_committee_checks_name_the_cause():
    keys = [Tally(j).public for j in range(4)]
    assert check_committee(keys[:3]) == tuple(keys[:3])
    with pytest.raises(ValueError, match="at least 3 tallies, got 2"):
        check_committee(keys[:2])
    with pytest.raises(ValueError, match="at least 4 tallies, got 3"):
        check_committee(keys[:3], minimum=4)
    with pytest.raises(ValueError, match="duplicate tallies"):
        check_committee([keys[0], keys[1], keys[0]])
    with pytest.raises(ValueError, match=r"unknown tallies \(not in this node's list\): \[2\]"):
        check_committee(keys[:3], known=keys[:2] + keys[3:])
    with pytest.raises(ValueError, match="tally 1's public key must be 32 bytes"):
        check_committee([keys[0], b"short", keys[2]])


def test_the_field_prime_is_read_without_mpycs_side_effects_on_the_host():
    """Importing mpyc parses sys.argv as MPyC options, sets up logging and installs uvloop; a client must not
    exit on its own command line (``--out`` is ambiguous for MPyC) nor change its event loop policy."""
    import subprocess
    import sys

    code = ("import sys, asyncio, logging; sys.argv = ['app', '--out', 'x', '-W', 'error']\n"
            "from dphype.secure.committee import field_modulus\n"
            "print(field_modulus(), type(asyncio.get_event_loop_policy()).__name__, len(logging.getLogger().handlers))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == [str(field_modulus()), "_UnixDefaultEventLoopPolicy", "0"]


def test_an_invalid_entrys_share_row_is_zeroed_in_the_job_so_no_party_ever_computes_on_it():
    """Defence in depth: a share a tally did not take (here the same contributor twice, both valid sharings) goes
    to the MPC as a zero row, whatever the flags do; a row kept would reach the sums if a flag were ever lost."""
    tallies = committee(1)
    keys = [t.public for t in tallies]
    for vote in (1, 3):
        sealed = client_sealed_shares("req-1", one_hot(5, vote), keys, voter_id(0, "a"))
        tallies[0].receive("a", sealed[0])
    send(tallies, "req-1", [one_hot(5, 2)])  # one valid contributor
    job = tallies[0].job()
    rows = np.frombuffer(base64.b64decode(job["shares"]), dtype="<u8").reshape(len(job["contributors"]), -1)
    assert job["contributors"] == ["a", "a", "client-0"] and job["invalid"] == [0, 1]
    assert not rows[[0, 1]].any() and rows[2].any()
