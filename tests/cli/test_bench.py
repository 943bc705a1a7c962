"""``dphype bench``: ksweep measures k on a user's own Task over a public proxy data set from any folder (a fresh
``dphype new`` app, as a user runs it); every other bench command runs from a repository checkout or is refused in one
line before any work; ``dphype bench --help`` works anywhere."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import clean_env, doc_blocks

from dphype import cli
from dphype.ml.data import Dataset
from dphype.ml.ksweep import Partition, split_proxy, sweep
from dphype.privacy.winner import noise_std
from dphype.release import DEFAULT_ARGMAX_BALLOT
from dphype.selection.voting import Ballot


def write_proxy(path: Path, rows: int = 300, seed: int = 0) -> Path:
    """A small public-looking tabular proxy: 5 features, a binary label, header row, label last."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 5))
    y = (x @ np.arange(1.0, 6.0) + rng.normal(size=rows) > 0).astype(int)
    np.savetxt(path, np.c_[x, y], delimiter=",", header="a,b,c,d,e,label", comments="", fmt=["%.5f"] * 5 + ["%d"])
    return path


@pytest.fixture
def app(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Iterator[Path]:
    """A fresh app from ``dphype new``, with a proxy CSV beside it; its modules are forgotten afterwards (the next
    test's app has the same package name in another folder)."""
    assert cli.main(["new", str(tmp_path / "my-app")]) == 0
    capsys.readouterr()
    write_proxy(tmp_path / "my-app" / "proxy.csv")
    yield tmp_path / "my-app"
    for name in [m for m in sys.modules if m == "my_app" or m.startswith("my_app.")]:
        del sys.modules[name]


def test_ksweep_in_a_fresh_app_folder_measures_every_k_on_the_apps_own_task(
        app: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(app)
    argv = ["bench", "ksweep", "--proxy", "proxy.csv", "--clients", "6", "--repetitions", "60", "--epsilon", "1", "4"]
    assert cli.main([*argv, "--json", "--out", "sweep.csv"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["task"] == "my_app.client_app:Task" and out["candidates"] == 8 and not out["maximize"]
    assert out["partition"] == "iid" and len(out["best"]) == 2 and Path(out["out"]).is_file()
    # Opt is the candidate the same Task rates best on the pooled rows (a log-loss: lowest)
    assert out["opt"] == int(np.argmin(out["reference"]))
    for best in out["best"]:
        mine = [r for r in out["rows"] if r["epsilon"] == best["epsilon"]]
        rows = {r["k"]: r for r in mine if r["ballot"] == "top-k"}
        assert set(rows) == set(range(1, 8))  # every k below the 8 candidates
        assert best["best_k"] == min(rows, key=lambda k: (rows[k]["gap"], k))
        (default,) = [r for r in mine if r["ballot"] == DEFAULT_ARGMAX_BALLOT]
        auto = Ballot.parse(DEFAULT_ARGMAX_BALLOT).resolve(8, noise_std(best["epsilon"]), 6).depth
        assert best["default_k"] == default["k"] == auto  # auto votes top-k with its k: the same releases as top-k
        assert (default["gap"], default["within"]) == (rows[auto]["gap"], rows[auto]["within"])
        assert best["default_behind"] == pytest.approx(default["gap"] - rows[best["best_k"]]["gap"])
        assert all(0 <= r["within"] <= 1 and r["gap"] >= 0 for r in mine)
    # readable text, and --task from another folder names the same Task: the same sweep
    monkeypatch.chdir(app.parent)
    assert cli.main([argv[0], argv[1], "--app", str(app), "--task", "my_app.client_app:Task", *argv[2:4],
                     "--proxy", str(app / "proxy.csv"), *argv[4:], "--json"]) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["rows"] == out["rows"]
    assert cli.main([*argv[:3], str(app / "proxy.csv"), "--app", str(app), "--ks", "1", "2"]) == 0
    text = capsys.readouterr().out
    assert "my_app.client_app:Task on " in text and "best k " in text and "the default ballot (k " in text


@pytest.mark.parametrize(("argv", "message"), [
    (["--proxy", "missing.csv"], "--proxy: no file 'missing.csv'"),
    (["--proxy", "nonsense"], "--proxy must be a registered data set"),
    (["--proxy", "proxy.csv", "--partition", "skewed"], "--partition must be iid or dirichlet:BETA"),
    (["--proxy", "proxy.csv", "--clients", "1"], "clients must be an integer >= 2"),
    (["--proxy", "proxy.csv", "--clients", "100"], "--clients 100 needs at least 400 rows of the proxy"),
    (["--proxy", "proxy.csv", "--ks", "8"], r"--ks must be integers in \[1, 7\]"),
    (["--proxy", "proxy.csv", "--task", "my_app.client_app"], "--task must be MODULE:NAME"),
    (["--proxy", "proxy.csv", "--task", "my_app.client_app:Nothing"], "cannot load Nothing from my_app.client_app"),
    (["--proxy", "proxy.csv", "--out", "sweep.txt"], "--out must name a .csv file"),
    (["--proxy", "proxy.csv", "--task", "my_app.client_app:local_data"],
     r"must be built from a client's rows as NAME\(x, y\)"),
])
def test_ksweeps_bad_input_is_refused_in_its_first_line(app: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str], argv: list[str],
                                                 message: str) -> None:
    monkeypatch.chdir(app)
    assert cli.main(["bench", "ksweep", *argv]) == 2
    line = capsys.readouterr().err.strip().splitlines()[0]
    assert line.startswith("dphype bench: error: ") and re.search(message, line), line


def test_ksweep_outside_an_app_needs_the_task_and_candidates_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    write_proxy(tmp_path / "proxy.csv")
    assert cli.main(["bench", "ksweep", "--proxy", "proxy.csv"]) == 2
    assert "holds no pyproject.toml: run it in your app's folder" in capsys.readouterr().err


class MeanTask:
    """A task whose score of candidate ``t`` is how far ``t`` lies from the mean label of its rows (lower: better)."""

    maximize = False

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.mean = float(np.mean(y))

    def score(self, candidates):
        return [abs(self.mean - c["t"]) for c in candidates]


def test_the_sweep_scores_picks_on_the_pooled_rows_and_a_clear_signal_at_a_large_epsilon_lands_on_opt() -> None:
    rng = np.random.default_rng(3)
    data = Dataset(rng.normal(size=(400, 2)), (rng.random(400) < 0.3).astype(int), 2, "toy")
    candidates = [{"t": t} for t in (0.0, 0.1, 0.3, 0.6, 0.9)]
    got = sweep(MeanTask, data, candidates, clients=8, epsilons=[50.0], ks=[1, 2], repetitions=200, tolerance=0.05)
    shards = split_proxy(data, 8, Partition(), 0)
    pooled = np.mean(np.concatenate([s.y for s in shards]))  # the reference: the same task on the pooled rows
    assert got["reference"] == pytest.approx([abs(pooled - c["t"]) for c in candidates])
    assert got["opt"] == 2  # t = 0.3 is nearest a mean label of about 0.3
    k1 = next(r for r in got["rows"] if r["ballot"] == "top-k" and r["k"] == 1)
    assert k1["gap"] == pytest.approx(0.0) and k1["within"] == 1.0  # every client's best is Opt; no noise to speak of
    assert Partition.parse("dirichlet:0.5") == Partition(0.5) and Partition(0.5).label == "Dirichlet 0.5"


def test_bench_help_works_anywhere_and_the_papers_studies_are_refused_outside_a_checkout_before_any_work(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    before = set(sys.modules)
    with pytest.raises(SystemExit) as done:
        cli.main(["bench", "--help"])
    assert done.value.code == 0 and "ksweep" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        cli.main(["bench", "ksweep", "--help"])
    assert done.value.code == 0 and "--proxy DATA" in capsys.readouterr().out
    for argv in (["tradeoff"], ["synthetic", "--help"], ["ksweep", "--dataset", "adult"], ["nonsense"]):
        assert cli.main(["bench", *argv]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("dphype bench: error: ") and len(line) < 120 and "checkout" in line, line
    assert not {name for name in set(sys.modules) - before if name.split(".")[0] == "simulations"}


@pytest.mark.slow
def test_the_guides_ksweep_block_runs_as_written_in_a_fresh_app_folder(tmp_path: Path) -> None:
    """docs/getting-started.md's block, verbatim, as a user types it after the README's first-app block: the installed
    console script in the app folder `dphype new` wrote, a clean environment, the bundled-with-the-bench-extra
    breast-cancer as the proxy."""
    pytest.importorskip("sklearn")
    (block,) = doc_blocks("docs/getting-started.md", "Measure k on data like yours", "bash")
    env = clean_env(tmp_path / "home")
    subprocess.run(["dphype", "new", "my-app"], cwd=tmp_path, env=env, check=True, capture_output=True, timeout=120)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path / "my-app", env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("my_app.client_app:Task on breast-cancer, 10 simulated clients (iid), 8 candidates")
    assert done.stdout.count("best k ") == 2 and done.stderr == ""
