"""Data-aware depths (`simulations.ksweep_aware`) and their out-of-sample fit in ``dphype bench ksweep-loto``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import write_sweep

from dphype.privacy.winner import winner_probabilities
from simulations import ksweep_aware, ksweep_loto
from simulations.cli import main
from simulations.ksweep_report import read_runs


def _federation(rng: np.random.Generator, n: int = 12, p: int = 30) -> ksweep_aware.Federation:
    return ksweep_aware.Federation(rng.random((n, p, 2)), rng.uniform(0.6, 0.9, p))


def test_one_client_moves_each_depth_candidate_count_by_at_most_one() -> None:
    """The joint family's privacy premise: the (depth, candidate) counts have l-infinity sensitivity 1."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        fed = _federation(rng)
        before = ksweep_aware.depth_counts(fed.scores, ksweep_aware.JOINT_DEPTHS)
        swapped = fed.scores.copy()
        swapped[rng.integers(len(swapped))] = rng.random(swapped.shape[1:])
        after = ksweep_aware.depth_counts(swapped, ksweep_aware.JOINT_DEPTHS)
        assert np.abs(after - before).max() <= 1
        assert before.shape == (len(ksweep_aware.JOINT_DEPTHS), fed.scores.shape[1])


def test_without_noise_the_joint_family_takes_the_best_offset_count() -> None:
    rng = np.random.default_rng(1)
    fed = _federation(rng)
    n, p = fed.scores.shape[:2]
    counts = ksweep_aware.depth_counts(fed.scores, ksweep_aware.JOINT_DEPTHS)
    gap = 100 * (fed.accuracy.max() - fed.accuracy)
    for beta in (0.5, 4.0, 12.0):
        offset = counts - beta * n * np.array(ksweep_aware.JOINT_DEPTHS)[:, None] / p
        winner = int(np.unravel_index(np.argmax(offset), offset.shape)[1])
        [(got_gap, got_within)] = ksweep_aware.joint_family(fed, 1e4, "replace-one", [beta], 50,
                                                            np.random.default_rng(2))
        assert got_gap == pytest.approx(gap[winner]) and got_within == float(gap[winner] <= 2)


def test_the_threshold_family_stops_at_the_first_depth_whose_top_count_passes() -> None:
    rng = np.random.default_rng(3)
    fed = _federation(rng, n=10)
    counts = ksweep_aware.depth_counts(fed.scores, ksweep_aware.JOINT_DEPTHS)
    for level in (0.3, 0.6, 0.9):
        depth = int(np.argmax(counts.max(axis=1) >= level * 10 + 0.5))
        # a huge first-round epsilon leaves AboveThreshold noiseless; the second round's epsilon is what is left
        [(gap, within)] = ksweep_aware.threshold_family(fed, 4000.0, "replace-one", [(0.999, level + 0.05)], 100,
                                                        np.random.default_rng(4))
        probs = winner_probabilities(counts[depth], 4.0, "replace-one")
        expected = 100 * (fed.accuracy.max() - fed.accuracy)
        assert gap == pytest.approx(float(probs @ expected))
        assert within == pytest.approx(float(probs[expected <= 2 + 1e-9].sum()))


def test_the_score_family_is_the_score_ballot_released_exactly() -> None:
    fed = _federation(np.random.default_rng(5))
    table = ksweep_aware.measure("score", fed, 1.0, "add-remove", 10, np.random.default_rng(0))
    rows = ksweep_aware.PARAMETERS["score"][1]
    assert table.shape == (len(rows), 2)
    from dphype.selection.voting import score_votes

    m, bits = rows[3]
    g = 2 ** int(bits) - 1
    counts = np.stack([score_votes(s, m, max_entry=g) for s in fed.scores]).sum(axis=0)
    probs = winner_probabilities(counts, 1.0, "add-remove", g)
    assert table[3, 0] == pytest.approx(float(probs @ (100 * (fed.accuracy.max() - fed.accuracy))))
    with pytest.raises(ValueError, match=f"family must be one of {', '.join(ksweep_aware.PARAMETERS)}, got 'magic'"):
        ksweep_aware.measure("magic", fed, 1.0, "replace-one", 10, np.random.default_rng(0))


def test_a_data_aware_family_is_fitted_without_the_task_it_is_measured_on(tmp_path: Path) -> None:
    ks = range(1, 7)
    runs = [write_sweep(tmp_path / name, name, {(20, 1.0): 3}, ks) for name in ("alpha", "beta", "gamma")]
    grid = ksweep_loto.Grid.of(read_runs(runs)[0], 20)  # the best fixed k trails 0 at each point
    # two parameter rows: row 0 trails 0.5 on alpha and beta, 6 on gamma; row 1 trails 3 everywhere
    table = np.zeros((2, 3, 2))
    order = [pt[0] for pt in grid.points]
    table[0, :, 0] = [6.0 if task == "gamma" else 0.5 for task in order]
    table[1, :, 0] = 3.0
    family = ksweep_loto.Family("toy", "toy", ("x",), np.array([[0.0], [1.0]]), measured=table)
    fits = {f["held_out"]: f for f in ksweep_loto.evaluate(grid, family, (20, "replace-one"))["fits"]}
    assert fits["gamma"]["x"] == 0.0 and fits["gamma"]["worst_behind"] == 6.0  # gamma's own rows never seen
    assert fits["alpha"]["x"] == 1.0 and fits["alpha"]["worst_behind"] == 3.0  # row 0 fails gamma in training
    points = ksweep_loto.evaluate(grid, family, (20, "replace-one"))["points"]
    assert {r["k"] for r in points} == {None}


def test_data_aware_families_need_the_runs_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = [write_sweep(tmp_path / name, name, {(20, 1.0): 3}, range(1, 7)) for name in ("alpha", "beta")]
    assert main(["ksweep-loto", "--runs", *map(str, runs), "--families", "ratio", "joint",
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "--cache" in err and "(joint)" in err
    assert main(["ksweep-loto", "--runs", *map(str, runs), "--families", "score", "--cache", str(tmp_path),
                 "--candidates", "20", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "--candidate-list" in err and "100 candidates" in err
    assert not (tmp_path / "out").exists()  # refused before any work


def test_the_pair_families_release_the_exact_noisy_max_over_their_pairs() -> None:
    """joint and shallow against the exact distribution of report-noisy-max over the stacked pair counts."""
    rng = np.random.default_rng(6)
    # every client ranks candidates 0 and 1 first and 2 to 5 next, the rest at random; 0 and 1 are the bad ones
    scores = np.concatenate([np.array([9.0, 8, 7, 6, 5, 4])[None, :] + rng.random((20, 6)),
                             rng.random((20, 94))], axis=1)[:, :, None].repeat(2, axis=2)
    fed = ksweep_aware.Federation(scores, np.where(np.arange(100) < 2, 0.6, 0.9))
    gap = 100 * (fed.accuracy.max() - fed.accuracy)

    def exact(pairs: np.ndarray) -> float:  # integer pair counts (depths, p), row-major as the families flatten them
        probs = winner_probabilities(pairs.ravel(), 1.0, "replace-one").reshape(pairs.shape).sum(axis=0)
        return float(probs @ gap)

    deep = ksweep_aware.auto_depth(100, ksweep_aware.noise_std(1.0), 20)
    assert deep > 2  # two distinct depths
    pairs = ksweep_aware.depth_counts(fed.scores, (2, deep)) + np.array([[3], [0]])
    [(got, _)] = ksweep_aware.shallow_family(fed, 1.0, "replace-one", [3.0], 8000, np.random.default_rng(7))
    assert got == pytest.approx(exact(pairs), abs=0.35)
    depths = np.array(ksweep_aware.JOINT_DEPTHS)
    pairs = ksweep_aware.depth_counts(fed.scores, depths) - 5 * depths[:, None]  # beta 25: offsets 5 k
    [(got, _)] = ksweep_aware.joint_family(fed, 1.0, "replace-one", [25.0], 8000, np.random.default_rng(8))
    assert got == pytest.approx(exact(pairs), abs=0.35)


def test_the_best_row_in_hindsight_bounds_every_fit(tmp_path: Path) -> None:
    ks = range(1, 7)
    runs = [write_sweep(tmp_path / name, name, {(20, 1.0): best}, ks, 3.0)
            for name, best in (("alpha", 1), ("beta", 1), ("gamma", 5))]
    grid = ksweep_loto.Grid.of(read_runs(runs)[0], 20)  # within 2 points: 1 - 3 |k - best| / 10
    mask = ksweep_loto.goal_mask(grid, (20, "replace-one"))
    assert mask.all()
    [constant] = ksweep_loto.families(list(ks), ["constant"])
    assert ksweep_loto.most_met(constant, grid, mask) == 2  # k = 1 meets alpha and beta; no k meets all three
    table = np.zeros((2, 3, 2))
    table[:, :, 1] = [[0.95, 0.5, 0.95], [0.5, 0.95, 0.95]]
    toy = ksweep_loto.Family("toy", "toy", ("x",), np.array([[0.0], [1.0]]), measured=table)
    assert ksweep_loto.most_met(toy, grid, mask) == 2
    table[1, :, 1] = 0.9
    assert ksweep_loto.most_met(toy, grid, mask) == 3


def test_the_uncertain_depth_follows_the_clients_own_binomial_error() -> None:
    acc = np.array([[0.80, 0.78, 0.75, 0.60], [0.80, 0.78, 0.75, 0.60]])
    # b~ = (0.8 v + 1) / (v + 2); 10 rows: error 0.122, so 0.75 is within 0.5 errors; 400 rows: error 0.020
    depths = ksweep_aware.uncertain_depths(acc, np.array([10, 400]), 0.5)
    assert depths.tolist() == [3, 1]
    assert ksweep_aware.uncertain_depths(acc, np.array([10, 400]), 0.0).tolist() == [1, 1]
    assert ksweep_aware.uncertain_depths(acc, np.array([10, 400]), 3.0).tolist() == [4, 3]
    # a client without a finite accuracy still votes once
    assert ksweep_aware.uncertain_depths(np.full((1, 4), np.nan), np.array([5]), 1.0).tolist() == [1]


def test_the_uncertain_ballots_move_each_count_by_at_most_one_client() -> None:
    """The family's privacy premise: a ballot of 0/1 entries whatever its depth, so one client's ballot changes each
    count by at most 1 (G = 1 of the winner release), and the counts are the clients' top-d ballots summed."""
    from dphype.selection.voting import top_k_votes

    rng = np.random.default_rng(7)
    for _ in range(10):
        local = np.stack([rng.integers(0, 6, (8, 20)) / 5, -rng.random((8, 20))], axis=-1)
        rows = rng.integers(2, 40, 8)
        fed = ksweep_aware.Federation(local, rng.uniform(0.6, 0.9, 20), local, rows)
        for below, floor in ((1e9, 1), (0, 4), (20, 2)):
            counts = ksweep_aware.uncertain_counts(fed, 1.0, below, floor)
            depth = np.clip(ksweep_aware.uncertain_depths(local[..., 0], rows, 1.0), floor, 10)
            keys = [k if v < below else k[:, ::-1] for k, v in zip(local, rows, strict=True)]  # accuracy first below
            expected = sum(top_k_votes(k, int(d)) for k, d in zip(keys, depth, strict=True))
            np.testing.assert_array_equal(counts, expected)
            changed = local.copy()
            changed[0] = np.stack([rng.integers(0, 6, 20) / 5, -rng.random(20)], axis=-1)
            moved = ksweep_aware.uncertain_counts(ksweep_aware.Federation(changed, fed.accuracy, changed, rows),
                                                  1.0, below, floor)
            assert np.abs(moved - counts).max() <= 1


def test_one_client_moves_the_skew_release_sum_by_at_most_its_sensitivity() -> None:
    """The skew family's privacy premise: ``(sum q_i, sum |q_i|^2)`` moves by at most 3 in l1 when one client's label
    shares change (replace-one), 2 when one client joins (add-remove)."""
    rng = np.random.default_rng(8)
    for classes in (2, 3, 10):
        shares = rng.dirichlet(np.full(classes, 0.3), 12)

        def released(q: np.ndarray) -> np.ndarray:
            return np.append(q.sum(axis=0), (q**2).sum())

        for _ in range(50):
            other = shares.copy()
            other[0] = np.eye(classes)[rng.integers(classes)] if rng.random() < 0.5 else rng.dirichlet(np.ones(classes))
            assert np.abs(released(other) - released(shares)).sum() <= ksweep_aware.SKEW_SENSITIVITY["replace-one"]
            assert np.abs(released(shares) - released(shares[1:])).sum() <= ksweep_aware.SKEW_SENSITIVITY["add-remove"]


def test_the_label_spread_is_zero_for_equal_mixes_and_unbiased_under_noise() -> None:
    same = np.tile([0.2, 0.3, 0.5], (20, 1))
    assert ksweep_aware.label_spread(same) == pytest.approx(0.0, abs=1e-12)
    apart = np.eye(2)[np.arange(20) % 2]  # half the clients hold only class 0, half only class 1
    assert ksweep_aware.label_spread(apart) == pytest.approx(0.5)
    # the noise's bias removed: the releases' mean is the spread, within 4 standard errors of 20,000 draws
    draws = ksweep_aware.noisy_spreads(apart, 5.0, "replace-one", np.random.default_rng(9), 20_000)
    assert abs(draws.mean() - 0.5) < 4 * draws.std() / np.sqrt(draws.size)


def test_the_skew_family_votes_deep_where_the_labels_are_skewed() -> None:
    """Noiseless first release (a huge epsilon): a skewed federation is released at depth D, an even one at the
    auto ballot's k, each exactly at what is left of epsilon."""
    from dphype.privacy.winner import noise_std
    from dphype.selection.voting import auto_depth

    rng = np.random.default_rng(10)
    even = ksweep_aware.Federation(rng.random((20, 30, 2)), rng.uniform(0.6, 0.9, 30),
                                   labels=np.full((20, 2), 0.5))
    skewed = ksweep_aware.Federation(even.scores, even.accuracy, labels=np.eye(2)[np.arange(20) % 2])
    gap = 100 * (even.accuracy.max() - even.accuracy)
    for fed, depth in ((even, auto_depth(30, noise_std(1.0, "replace-one"), 20)), (skewed, 12)):
        [(got, within)] = ksweep_aware.skew_family(fed, 2000.0, "replace-one", [(0.9995, 0.1, 12.0)], 200,
                                                   np.random.default_rng(11))
        probs = winner_probabilities(ksweep_aware.depth_counts(fed.scores, [depth])[0], 1.0, "replace-one")
        assert got == pytest.approx(float(probs @ gap)) and within == pytest.approx(float(probs[gap <= 2].sum()))


def test_the_small_family_is_the_uncertain_ballot_up_to_n_and_the_auto_ballot_above() -> None:
    from dphype.privacy.winner import noise_std
    from dphype.selection.voting import auto_depth

    rng = np.random.default_rng(12)
    local = np.stack([rng.integers(0, 6, (12, 30)) / 5, -rng.random((12, 30))], axis=-1)
    fed = ksweep_aware.Federation(local, rng.uniform(0.6, 0.9, 30), local, rng.integers(2, 40, 12))
    below, above = ksweep_aware.small_family(fed, 1.0, "replace-one", [(1.0, 25.0, 20.0), (1.0, 25.0, 10.0)])
    assert below == ksweep_aware.uncertain_family(fed, 1.0, "replace-one", [(1.0, 25.0, 1)])[0]
    probs = winner_probabilities(ksweep_aware.depth_counts(
        fed.scores, [auto_depth(30, noise_std(1.0, "replace-one"), 12)])[0], 1.0, "replace-one")
    gap = 100 * (fed.accuracy.max() - fed.accuracy)
    assert above == pytest.approx((float(probs @ gap), float(probs[gap <= 2 + 1e-9].sum())))
