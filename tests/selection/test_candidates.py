import json

import numpy as np
import pytest

from dphype.selection.candidates import (
    CandidateList,
    CandidateMismatchError,
    candidate_grid,
    load_candidates,
    random_subset,
    table_iii_grid,
)


def test_table_iii_has_100_candidates_in_paper_order():
    cands = table_iii_grid()
    assert len(cands) == 100
    assert cands[0] == {"lr": 0.5, "decay": 0.0, "momentum": 0.0}
    assert cands[1] == {"lr": 0.5, "decay": 0.0, "momentum": 0.9}  # momentum fastest
    assert cands[2] == {"lr": 0.5, "decay": 0.1, "momentum": 0.0}
    assert cands[10] == {"lr": 0.1, "decay": 0.0, "momentum": 0.0}  # lr-major
    assert cands[99] == {"lr": 1e-7, "decay": 1.0, "momentum": 0.9}
    assert sorted({c["lr"] for c in cands}) == sorted(
        [0.5, 0.1, 0.05, 1e-3, 5e-3, 1e-5, 1e-6, 5e-6, 5e-7, 1e-7]
    )
    assert sorted({c["decay"] for c in cands}) == [0.0, 0.1, 0.25, 0.99, 1.0]
    assert sorted({c["momentum"] for c in cands}) == [0.0, 0.9]


def test_fingerprint_is_stable_and_order_sensitive():
    a = table_iii_grid()
    assert a.fingerprint() == table_iii_grid().fingerprint()
    assert len(a.fingerprint()) == 64
    reordered = CandidateList(list(a)[::-1])
    assert reordered.fingerprint() != a.fingerprint()
    # dict key order does not matter, values do
    b = CandidateList([{"momentum": c["momentum"], "decay": c["decay"], "lr": c["lr"]} for c in a])
    assert b.fingerprint() == a.fingerprint() and b == a
    changed = list(a)
    changed[42] = {**changed[42], "lr": 0.2}
    assert CandidateList(changed).fingerprint() != a.fingerprint()


def test_check_fingerprint_fails_loudly():
    a = table_iii_grid()
    a.check_fingerprint(a.fingerprint())
    other = random_subset(a, 99, seed=0)
    with pytest.raises(CandidateMismatchError, match="mismatch"):
        other.check_fingerprint(a.fingerprint())
    assert issubclass(CandidateMismatchError, ValueError)


def test_json_round_trip_keeps_fingerprint():
    a = candidate_grid(lr=[0.1, 1e-7], opt=["sgd", "adam"], epochs=[1, 5])
    b = CandidateList.from_json(a.to_json())
    assert b == a and b.fingerprint() == a.fingerprint()
    assert json.loads(a.to_json())[0] == {"epochs": 1, "lr": 0.1, "opt": "sgd"}


def test_empty_duplicate_and_bad_values_rejected():
    with pytest.raises(ValueError, match="at least 1"):
        CandidateList([])
    with pytest.raises(ValueError, match="duplicate"):
        CandidateList([{"lr": 0.1}, {"lr": 0.2}, {"lr": 0.1}])
    with pytest.raises(ValueError, match="duplicate"):
        CandidateList([{"lr": 1}, {"lr": 1.0}])
    with pytest.raises(ValueError, match="finite"):
        CandidateList([{"lr": float("nan")}])
    with pytest.raises(ValueError, match="must be a float"):
        CandidateList([{"lr": [0.1]}])
    with pytest.raises(ValueError, match="empty"):
        CandidateList([{}])
    with pytest.raises(ValueError, match="at least 1 value"):
        candidate_grid(lr=[])
    with pytest.raises(ValueError, match="malformed"):
        CandidateList.from_json("[{")


def test_immutable_items_are_copies():
    a = table_iii_grid()
    item = a[0]
    item["lr"] = 123.0
    assert a[0]["lr"] == 0.5


def test_candidate_grid_has_no_deprecated_alias():
    import dphype
    from dphype.selection import candidates

    assert not hasattr(dphype, "grid") and not hasattr(candidates, "grid") and "grid" not in dphype.__all__
    assert dphype.candidate_grid is candidates.candidate_grid


def test_numpy_values_normalized():
    a = candidate_grid(lr=list(np.array([0.1, 0.2])), epochs=list(np.array([1, 2])))
    assert type(a[0]["lr"]) is float and type(a[0]["epochs"]) is int
    assert a == candidate_grid(lr=[0.1, 0.2], epochs=[1, 2])


def test_random_subset_seeded_and_order_preserving():
    full = table_iii_grid()
    s1 = random_subset(full, 20, seed=3)
    s2 = random_subset(full, 20, seed=3)
    s3 = random_subset(full, 20, seed=4)
    assert s1 == s2 and s1 != s3 and len(s1) == 20
    positions = [list(full).index(c) for c in s1]
    assert positions == sorted(positions)
    with pytest.raises(ValueError, match=r"size must be an integer in \[1, 100\]"):
        random_subset(full, 0, seed=0)
    with pytest.raises(ValueError, match="size"):
        random_subset(full, 101, seed=0)


def test_load_candidates_specs(tmp_path):
    assert load_candidates("table3") == table_iii_grid()
    assert load_candidates("table3:random:10:7") == random_subset(table_iii_grid(), 10, 7)
    path = tmp_path / "c.json"
    path.write_text(json.dumps([{"lr": 0.1}, {"lr": 0.01}]))
    assert len(load_candidates(str(path))) == 2
    with pytest.raises(ValueError, match="spec"):
        load_candidates("table4")
    with pytest.raises(ValueError, match="integers"):
        load_candidates("table3:random:x:1")
    with pytest.raises(FileNotFoundError):
        load_candidates(str(tmp_path / "missing.json"))


def test_feature_space_of_table_iii():
    space = table_iii_grid().feature_space()
    assert [(a.name, a.scale, len(a.levels)) for a in space.axes] == [
        ("lr", "log", 10), ("decay", "linear", 5), ("momentum", "linear", 2)]
    assert space.no_structure is None and space.numeric.shape == (100, 3) and space.categorical.shape == (100, 0)
    # lr on a log scale mapped to [0, 1]: log(lr / 1e-7) / log(0.5 / 1e-7)
    lr = np.array([c["lr"] for c in table_iii_grid()])
    assert np.allclose(space.numeric[:, 0], np.log(lr / 1e-7) / np.log(0.5 / 1e-7))
    assert space.numeric[2].tolist() == [1.0, 0.1, 0.0]  # lr 0.5, decay 0.1, momentum 0
    assert space.numeric[1, 2] == 1.0  # momentum 0.9 is the top of its axis


def test_feature_space_scales_categories_and_overrides():
    cands = candidate_grid(opt=["sgd", "adam"], bs=[16, 64, 256], nesterov=[True, False], wd=[0.0, 1e-4])
    space = cands.feature_space()
    assert {a.name: a.scale for a in space.axes} == {
        "opt": "categorical", "bs": "log", "nesterov": "categorical", "wd": "linear"}
    assert space.categorical.shape == (24, 2) and set(space.categorical[:, 0]) == {0, 1}
    assert {a.name: a.scale for a in cands.feature_space({"bs": "linear"}).axes}["bs"] == "linear"
    assert cands.feature_space({"bs": "categorical"}).categorical.shape == (24, 3)
    with pytest.raises(ValueError, match=r"scales\['wd'\] = 'log' needs numbers > 0"):
        cands.feature_space({"wd": "log"})
    with pytest.raises(ValueError, match=r"scales\['opt'\] = 'linear' needs numbers"):
        cands.feature_space({"opt": "linear"})
    with pytest.raises(ValueError, match=r"scales\['bs'\] must be one of log, linear, categorical"):
        cands.feature_space({"bs": "sqrt"})
    with pytest.raises(ValueError, match="scales names unknown hyperparameters"):
        cands.feature_space({"lr": "log"})
    # a constant hyperparameter carries nothing and is left out
    assert [a.name for a in candidate_grid(lr=[0.1, 0.01, 0.001], seed=[0]).feature_space().axes] == ["lr"]


def test_feature_space_without_structure_says_why():
    single = CandidateList([{"model": m} for m in ("mlp", "cnn", "vit")]).feature_space()
    assert "single categorical axis" in single.no_structure
    mixed = CandidateList([{"a": 1}, {"a": "x"}, {"a": 3.5}]).feature_space()  # mixed types: categorical
    assert mixed.axes[0].scale == "categorical" and "single categorical axis" in mixed.no_structure
    conditional = CandidateList([{"opt": "sgd", "momentum": 0.9}, {"opt": "adam"}, {"opt": "sgd", "momentum": 0.0}])
    assert "missing from candidate 1" in conditional.feature_space().no_structure
    assert "fewer than 3 candidates" in candidate_grid(lr=[0.1, 0.01]).feature_space().no_structure
