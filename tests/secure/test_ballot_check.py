"""The committee checks every ballot under MPC: malicious clients in process, each check at its
boundary. A malicious client skips its own check and shares whatever digits it likes; the tallies leave its ballot
out and name it (never its content) while the honest consensus wins, and release nothing when too few valid ballots
remain. The tallies' noise shares are zero here so that the opened index is the argmax of the valid ballots."""

import numpy as np
import pytest

from dphype.secure.committee import (
    Opening,
    Tally,
    TallyError,
    ballot_bits,
    field_modulus,
    run_loopback_committee,
    share_context,
    split_shares,
    voter_id,
)
from dphype.secure.relay import seal
from dphype.selection.ballots import BallotForm

P = 8


def open_committee(form, minimum, request="req-b"):
    tallies = [Tally(j) for j in range(3)]
    for t in tallies:
        t.open_round(request, P, minimum, form=form, noise=np.zeros(P, dtype=np.int64))
    return tallies


def cast(tallies, label, digits, request="req-b"):
    """Seal Shamir shares of ``digits`` (any integers, as a modified client would send) to the tallies."""
    shares = split_shares(np.asarray(digits, dtype=object), 3, field_modulus())
    for j, (t, share) in enumerate(zip(tallies, shares, strict=True)):
        blob = seal(t.public, np.asarray(share, dtype=np.uint64).tobytes(),
                    context=share_context(request, j, voter_id(0, label)))
        t.receive(label, blob)


def ballot(*ones, p=P):
    out = np.zeros(p, dtype=np.int64)
    out[list(ones)] = 1
    return out


def run(tallies):
    return run_loopback_committee([t.job() for t in tallies], timeout=60)


def test_malicious_top_k_ballots_are_excluded_and_named_while_the_honest_consensus_wins():
    """More than k ones, an entry of 2, an entry of -1, a boost of 30 votes (once hidden in client noise), fewer than
    k ones and a sign-flipped pair that keeps the total at k: every one is left out and named; the honest clients'
    favourite (candidate 3) wins, though the boosts alone would make candidate 6 win."""
    k = 2
    tallies = open_committee(BallotForm.top_k(k), minimum=5)
    honest = [ballot(3, i) for i in (0, 1, 2, 4, 5)]  # everyone ranks candidate 3 first
    for c, b in enumerate(honest):
        cast(tallies, f"honest-{c}", b)
    cheats = {
        "more-ones": ballot(6, 7, 5),
        "two": np.array([0, 0, 0, 0, 0, 0, 2, 0]),
        "minus-one": np.array([0, 0, 0, -1, 0, 1, 1, 1]),  # total k, but -1 is not a bit
        "boost": np.array([0, 0, 0, 0, 0, 0, 30, 0]),
        "too-few": ballot(6),
        "sign-pair": np.array([0, 0, 0, -5, 0, 0, 6, 1]),  # total k = 2 exactly
    }
    for label, digits in cheats.items():
        cast(tallies, label, digits)
    opened = run(tallies)
    assert opened == Opening(3, tuple(sorted(cheats)))  # labels in the committee's (sorted) order


def test_too_many_invalid_ballots_release_nothing_and_the_error_names_them():
    tallies = open_committee(BallotForm.top_k(1), minimum=3)
    for c in range(2):
        cast(tallies, f"honest-{c}", ballot(c))
    cast(tallies, "boost", np.array([0, 0, 0, 0, 0, 9, 0, 0]))
    with pytest.raises(TallyError, match=r"only 2 valid ballots, fewer than the committee's minimum 3 \(1 invalid\) "
                                         r"\(invalid ballots from contributors boost\); nothing released") as err:
        run(tallies)
    assert err.value.excluded == ("boost",)


def test_the_valid_ballots_may_number_exactly_the_minimum():
    tallies = open_committee(BallotForm.top_k(1), minimum=3)
    for c in range(3):
        cast(tallies, f"honest-{c}", ballot(4))
    cast(tallies, "two-ones", ballot(0, 1))
    assert run(tallies) == Opening(4, ("two-ones",))


def test_graded_ballots_are_checked_digit_by_digit_and_every_range_boundary_holds():
    """max_entry = 3 (2 digits per entry), totals in [2, 6]. Valid at the boundaries: entry 3, totals 2 and 6.
    Invalid just outside: totals 1 and 7; a digit of 2 whose weighted entry (2) would be in range; an entry of 4
    (its digits are the bits of 4 mod 4 = 0 with a carry the client cannot send as a bit)."""
    form = BallotForm(3, 2, 6)
    tallies = open_committee(form, minimum=4)
    valid = {"max-entry": np.array([0, 0, 0, 0, 0, 0, 0, 3]) + ballot(6),  # total 4, an entry of 3
             "total-2": np.array([0, 0, 0, 0, 0, 0, 0, 2]),
             "total-6": np.array([0, 0, 0, 0, 0, 3, 0, 3]),
             "spread": np.array([1, 1, 1, 1, 0, 0, 0, 2])}  # total 6
    for label, b in valid.items():
        form.check(b, P)
        cast(tallies, label, ballot_bits(b, form.bits))
    bad_digit = ballot_bits(np.array([0, 0, 0, 0, 0, 0, 0, 2]), form.bits)
    bad_digit[-2:] = [2, 0]  # the entry 2 * 1 + 0 * 2 = 2 is in range, but its digit 2 is not a bit
    invalid = {"total-1": ballot_bits(ballot(0), form.bits), "total-7": ballot_bits(np.array([0, 0, 0, 0, 0, 3, 1, 3]),
                                                                                      form.bits),
               "digit-2": bad_digit, "entry-4": np.concatenate([[0, 2], np.zeros(2 * P - 2, dtype=np.int64)])}
    for label, digits in invalid.items():
        cast(tallies, label, digits)
    opened = run(tallies)
    assert opened == Opening(7, tuple(sorted(invalid)))  # 3 + 2 + 3 + 2 votes for candidate 7


def test_an_exact_total_is_checked_at_k_minus_one_k_and_k_plus_one():
    tallies = open_committee(BallotForm.top_k(3), minimum=1)
    cast(tallies, "k-1", ballot(0, 1))
    cast(tallies, "k", ballot(0, 1, 2))
    cast(tallies, "k+1", ballot(0, 1, 2, 5))
    assert run(tallies) == Opening(0, ("k+1", "k-1"))


def test_all_valid_ballots_open_only_the_index_and_no_one_is_excluded():
    tallies = open_committee(BallotForm.top_k(2), minimum=2)
    for c in range(4):
        cast(tallies, f"c{c}", ballot(5, c))
    assert run(tallies) == Opening(5, ())


def test_a_ballot_shared_inconsistently_is_excluded_and_named_and_the_tallies_still_agree():
    """A modified client deals shares that lie on no line (a degree-2 polynomial, not a Shamir sharing of degree 1):
    every pair of tallies would read another ballot, and MPyC's parties, each opening from its own pair, would disagree
    or desynchronise. The committee checks every sharing's degree first (a random combination opened in full and
    with t + 1 shares, masked by the tallies' own random inputs): the client is left out and named."""
    tallies = open_committee(BallotForm.top_k(1), minimum=3)
    for c in range(3):
        cast(tallies, f"honest-{c}", ballot(2))
    q = field_modulus()
    shares = split_shares(np.asarray(ballot(6), dtype=object), 3, q)  # a valid ballot ...
    shares[2] = [(v + 30) % q for v in shares[2]]  # ... with tally 2's shares moved off the line
    for j, (t, share) in enumerate(zip(tallies, shares, strict=True)):
        t.receive("skewed", seal(t.public, np.asarray(share, dtype=np.uint64).tobytes(),
                                 context=share_context("req-b", j, voter_id(0, "skewed"))))
    assert run(tallies) == Opening(2, ("skewed",))


def test_an_inconsistent_sharing_built_to_pass_the_bit_check_is_caught_by_the_degree_check():
    """The attack the degree check is for: shares on f(x) = a - 3c x + c x^2. Read from all 3 tallies (how MPyC's
    multiplications and full openings read it) every entry is the valid bit a and x(x - 1) checks to 0, so the form
    checks pass; read from 2 tallies (how each party opens its outputs) the entry is a - 2c, a - 6c or a - 3c: with
    c = -10 a boost of 20 to 60 votes for candidate 6 that every party would see (and as many less for candidate 0,
    so that the totals' linear check reads a consistent sharing as well). The committee must leave it out."""
    tallies = open_committee(BallotForm.top_k(1), minimum=3)
    for c in range(3):
        cast(tallies, f"honest-{c}", ballot(2))
    q = field_modulus()
    values = ballot(6)
    skew = np.zeros(P, dtype=object)
    skew[6], skew[0] = -10, 10  # summing to 0: the total's check reads a consistent sharing too
    shares = [[int(a - 3 * c * x + c * x * x) % q for a, c in zip(values, skew, strict=True)] for x in (1, 2, 3)]
    for j, (t, share) in enumerate(zip(tallies, shares, strict=True)):
        t.receive("skewed", seal(t.public, np.asarray(share, dtype=np.uint64).tobytes(),
                                 context=share_context("req-b", j, voter_id(0, "skewed"))))
    assert run(tallies) == Opening(2, ("skewed",))


def test_a_share_that_does_not_parse_at_one_tally_leaves_its_ballot_out_instead_of_stopping_the_selection():
    """A client seals a share of the wrong length to tally 0 and values outside the field to tally 2 (its other shares
    are a valid ballot's): the tallies keep it as malformed, the committee leaves it out and names it, and the
    selection goes on."""
    tallies = open_committee(BallotForm.top_k(1), minimum=3)
    for c in range(3):
        cast(tallies, f"honest-{c}", ballot(2))
    q = field_modulus()
    for label, fault in (("short", 0), ("outside", 2)):
        shares = split_shares(np.asarray(ballot(6), dtype=object), 3, q)
        blobs = [np.asarray(share, dtype=np.uint64).tobytes() for share in shares]
        blobs[fault] = blobs[fault][:-8] if label == "short" else np.full(P, 2**64 - 1, dtype=np.uint64).tobytes()
        for j, (t, blob) in enumerate(zip(tallies, blobs, strict=True)):
            t.receive(label, seal(t.public, blob, context=share_context("req-b", j, voter_id(0, label))))
    assert run(tallies) == Opening(2, ("outside", "short"))


def test_ballots_whose_totals_are_right_but_whose_digits_are_not_bits_are_excluded():
    """Every invalid ballot here keeps the total right, so only the bit term ``sum r x (x - 1)`` of the committee's
    one check can see it: +30 / -29 / +1 (total k = 2: 30 votes for candidate 6 and 29 taken from the honest favourite
    3) and -1 / +1 / +1 / +1. Both are left out and named and the honest favourite wins; counted, they would make
    candidate 6 win."""
    tallies = open_committee(BallotForm.top_k(2), minimum=5)
    for c in (0, 1, 2, 4, 5):
        cast(tallies, f"honest-{c}", ballot(3, c))
    cheats = {"boost": np.array([1, 0, 0, -29, 0, 0, 30, 0]), "minus-one": np.array([0, 0, 0, -1, 0, 1, 1, 1])}
    assert all(int(digits.sum()) == 2 for digits in cheats.values())
    for label, digits in cheats.items():
        cast(tallies, label, digits)
    opened = run(tallies)
    assert opened == Opening(3, ("boost", "minus-one")), (
        f"ballots with the right total but digits that are not bits were counted: {opened}")


def test_a_graded_ballot_whose_digit_is_not_a_bit_but_whose_entries_and_total_are_in_range_is_excluded():
    """max_entry = 3, totals in [2, 6]: a digit of 2 in the low place makes the entry 2 (in range) and the total 2 (in
    range); only the bit term sees it. Two such ballots are left out and named; counted, their candidate 6 would tie
    the honest favourite 7 (4 votes each) and win the tie."""
    form = BallotForm(3, 2, 6)
    tallies = open_committee(form, minimum=2)
    for label in ("a", "b"):
        cast(tallies, label, ballot_bits(np.array([0, 0, 0, 0, 0, 0, 0, 2]), form.bits))
    digits = np.zeros(P * form.bits, dtype=np.int64)
    digits[6 * form.bits] = 2  # entry 6 = 2 * 1 + 0 * 2 = 2, total 2
    cast(tallies, "digit-2", digits)
    cast(tallies, "digit-2-again", digits)
    opened = run(tallies)
    assert opened == Opening(7, ("digit-2", "digit-2-again")), (
        f"a ballot whose digit is not a bit was counted: {opened}")
