"""The result object (dphype.result.DPHypeResult): best_params, ranked table, summary, JSON round trip."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from helpers import CANDIDATES, a_release

from dphype import DPHypeResult


@pytest.mark.parametrize("rule", ["gp", "max-votes"])
def test_best_params_and_the_ranked_table(rule):
    result = a_release(rule)
    assert result.best_params == CANDIDATES[result.selected_index] == result.selected
    table = result.table()
    assert [row["rank"] for row in table] == list(range(1, 9)) and table[0]["index"] == result.selected_index
    assert sorted(row["index"] for row in table) == list(range(8))
    assert all(row["votes"] == result.noisy_sum[row["index"]] for row in table)
    assert {"lr", "steps"} <= set(table[0])
    if rule == "max-votes":
        assert "estimate" not in table[0] and [row["votes"] for row in table] == sorted(result.noisy_sum)[::-1]
    else:
        estimates = [row["estimate"] for row in table]
        assert estimates == sorted(estimates, reverse=True)  # ranked by the rule's estimate
    assert len(result.table(top=3)) == 3


def test_summary_is_readable_text():
    result = a_release()
    text = result.summary(top=3)
    lines = text.splitlines()
    assert lines[0] == (f"DP-Hype selected candidate {result.selected_index} of 8: "
                        f"lr={result.selected['lr']}, steps={result.selected['steps']}")
    assert "rule: gp; confidence: P(top-voted)" in lines[1]
    assert lines[2].startswith("privacy: (5, 1e-05)-DP per client (replace-one, rdp accountant), skellam noise")
    assert "20 of 20 clients contributed" in lines[2]
    header = lines[-4].split()
    assert header == ["rank", "index", "lr", "steps", "votes", "estimate"] and len(lines[-3:]) == 3
    assert str(result) == result.summary()


def test_a_pure_release_states_delta_zero():
    """The winner release is pure epsilon-DP: its summary says (epsilon, 0)-DP, not the run's delta, and the flag
    survives the JSON round trip."""
    from dphype.config import DPHypeConfig
    from dphype.protocol import make_vote_request
    from dphype.secure.committee import Tally

    config = DPHypeConfig(epsilon=1.0, delta=1e-5, k=2, clients=20, release="argmax")
    request = make_vote_request(config, CANDIDATES, tallies=tuple(Tally(j).public for j in range(3)))
    result = request.mode.release(request, 2, 20)
    assert result.report.release_delta < 1e-18 and result.report.delta == 1e-5  # the run's delta, for composing
    privacy = result.summary().splitlines()[2]
    assert privacy.startswith("privacy: (1, 2e-19)-DP per client (replace-one, report-noisy-max")
    assert "1e-05" not in privacy
    back = DPHypeResult.from_dict(json.loads(json.dumps(result.to_dict()))).report
    assert back.release_delta == result.report.release_delta
    assert a_release().report.release_delta is None and a_release().report.guarantee() == "(5, 1e-05)-DP"


def test_save_and_load_round_trip(tmp_path):
    result = dataclasses.replace(a_release(), secure_sum={"num_shares": 19, "statement": "bounds"})
    loaded = DPHypeResult.load(result.save(tmp_path / "result.json"))
    assert loaded.best_params == result.best_params and loaded.selected_index == result.selected_index
    assert loaded.report == result.report and loaded.secure_sum == result.secure_sum
    assert np.array_equal(loaded.noisy_sum, result.noisy_sum)
    assert np.array_equal(loaded.selection.estimate, result.selection.estimate)
    assert loaded.candidates.fingerprint() == CANDIDATES.fingerprint()
    assert loaded.summary() == result.summary() and loaded.to_dict() == result.to_dict()


def test_the_json_names_the_pick_best_params_and_only_that(tmp_path):
    """The record names the selected candidate ``best_params``, as the Python result does; a record without it (the
    ``selected`` of a development build) is incomplete."""
    result = a_release()
    record = result.to_dict()
    assert record["best_params"] == result.best_params and "selected" not in record
    old = {("selected" if key == "best_params" else key): value for key, value in record.items()}
    (tmp_path / "old.json").write_text(json.dumps(old))
    with pytest.raises(ValueError, match="incomplete: 'best_params'"):
        DPHypeResult.load(tmp_path / "old.json")


def test_load_refuses_other_files(tmp_path):
    record = a_release().to_dict()
    (tmp_path / "other.json").write_text(json.dumps({**record, "format": "something"}))
    with pytest.raises(ValueError, match="format must be 'dphype-result/1'"):
        DPHypeResult.load(tmp_path / "other.json")
    (tmp_path / "lying.json").write_text(json.dumps({**record, "selected_index": (record["selected_index"] + 1) % 8}))
    with pytest.raises(ValueError, match="best_params must be the candidate at selected_index"):
        DPHypeResult.load(tmp_path / "lying.json")
    (tmp_path / "short.json").write_text(json.dumps({k: v for k, v in record.items() if k != "privacy"}))
    with pytest.raises(ValueError, match="incomplete.*privacy"):
        DPHypeResult.load(tmp_path / "short.json")


def test_a_release_without_votes_has_no_votes_column():
    """A release mode that opens only the winner (no vote sum) still ranks by the rule's estimate."""
    result = dataclasses.replace(a_release(), noisy_sum=None)
    assert "votes" not in result.table()[0] and "estimate" in result.table()[0]
    assert DPHypeResult.from_dict(result.to_dict()).noisy_sum is None


def test_a_run_records_summary_leaves_the_plan_to_the_json_the_log_printed_its_advice_once():
    from dphype.result import summarize_run

    advice = "8 candidates, 10 voters, epsilon 1: bench gap to Opt median 4.0, p90 9.1 points"
    result = dataclasses.replace(a_release(), plan={"advice": advice, "warnings": ["a plan warning"]})
    assert DPHypeResult.from_dict(json.loads(json.dumps(result.to_dict()))).plan == result.plan  # the JSON has it
    assert advice not in result.summary()
    record = {**result.to_dict(), "accuracy": 0.8, "warnings": ["the pick's confidence is low"]}
    text = summarize_run(record)
    assert "accuracy: 0.8" in text and "warning: the pick's confidence is low" in text
    assert advice not in text and "a plan warning" not in text and "plan" not in text.replace("planner", "")
