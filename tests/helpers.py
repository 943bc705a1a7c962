"""Plain helpers the test modules share (no test module imports another; pytest fixtures live in the
``conftest.py`` files). One section per kind of test:

- node policy and vote requests: :data:`PERMISSIVE`, :func:`make_request`;
- in-process Flower federations: :data:`CANDS`, :class:`TableTask`, :func:`scores_table`, :func:`client_app`,
  :func:`grid_of`, :func:`sum_config`; the argmax release's tally committee: :func:`argmax_grid`,
  :func:`argmax_config`;
- released results: :func:`a_release`;
- reference accuracies (majority class, Opt): :func:`majority_accuracy`, :func:`majority_of_test_split`,
  :func:`candidate_accuracies`;
- Flower CLI processes (``flwr run``, loopback deployment): :data:`REPO`, :data:`BIN`, :func:`offline_env`,
  :func:`processes_with`, :func:`descendants`, :func:`stop`, :func:`parse_result`;
- the bench studies on a tiny configuration: :data:`TINY`, :func:`bench`.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from dphype.config import DPHypeConfig
from dphype.flower import register_dphype
from dphype.flower.local import LocalGrid, node_id
from dphype.flower.tally import load_tally_key
from dphype.ml.models import MODEL_FOR_DATASET
from dphype.ml.task import load_cached, make_task
from dphype.ml.training import accuracy, fedavg
from dphype.protocol import VoteRequest, make_vote_request
from dphype.result import DPHypeResult
from dphype.secure.tally import loopback_addresses
from dphype.selection.candidates import CandidateList, candidate_grid, table_iii_grid

#: The repository root (``flwr run .``, the server/ and clients/ sides, pyproject.toml).
REPO = Path(__file__).resolve().parents[1]

# --- Node policy and vote requests --------------------------------------------------------------------------------

#: Node-config keys of a policy that admits the small, large-budget federations of the protocol tests (the
#: defaults ask for at least 10 clients, 4 neighbours and epsilon <= 1): what their nodes' operators set.
PERMISSIVE = {"dphype-max-epsilon": 1000.0, "dphype-min-clients": 2, "dphype-min-neighbours": 1,
              "dphype-lifetime-epsilon": 1e6}


def make_request(
    epsilon: float = 1.0,
    delta: float = 1e-5,
    k: int = 5,
    clients: int = 50,
    dropout: float = 0.0,
    noise: str = "skellam",
    accountant: str | None = None,
    sigma: float | None = None,
    candidates: CandidateList | None = None,
) -> VoteRequest:
    """The request a server sends: sigma calibrated for the announced budget, unless a lying server gives ``sigma``."""
    config = DPHypeConfig(epsilon, delta, k, clients, dropout, noise, accountant)
    candidates = table_iii_grid() if candidates is None else candidates
    return make_vote_request(config, candidates) if sigma is None else VoteRequest(candidates, config, sigma)


# --- In-process Flower federations --------------------------------------------------------------------------------

CANDS = candidate_grid(lr=[0.001, 0.01, 0.1, 0.5], momentum=[0.0, 0.9])  # 8 candidates


class TableTask:
    """Scores from a fixed table row per client (no training); an exception row raises."""

    maximize = True

    def __init__(self, scores) -> None:
        self.scores = scores

    def score(self, candidates):
        if isinstance(self.scores, Exception):
            raise self.scores
        return self.scores


def scores_table(n: int, seed: int = 0) -> np.ndarray:
    """Every client likes candidate 5 best; the rest of its ranking is random."""
    scores = np.random.default_rng(seed).uniform(0.0, 0.8, size=(n, len(CANDS)))
    scores[:, 5] = 0.9
    return scores


def grid_of(app: ClientApp, n: int, **kwargs) -> LocalGrid:
    """``n`` nodes whose operators set :data:`PERMISSIVE` in their node config."""
    return LocalGrid(app, n, node_config=PERMISSIVE, **kwargs)


def client_app(scores, own_messages=None, policy=None) -> ClientApp:
    """A user's Message-API ClientApp with its own train handler, plus DP-Hype's handlers."""
    app = ClientApp()
    register_dphype(app, lambda ctx: TableTask(scores[int(ctx.node_config["partition-id"])]), policy=policy)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        if own_messages is not None:
            own_messages.append(msg.metadata.message_type)
        return Message(RecordDict({"config": ConfigRecord({"seen": 1})}), reply_to=msg)

    return app


def sum_config(**overrides) -> DPHypeConfig:
    """A sum-release selection among 6 clients (k = 3, epsilon 1), with ``overrides``."""
    values = dict(epsilon=1.0, delta=1e-5, k=3, clients=6)
    values.update(overrides)
    return DPHypeConfig(**values)


#: Voters of the argmax federations (:func:`argmax_grid`).
CLIENTS = 6


def argmax_grid(tmp_path, *, clients=CLIENTS, silent=(), tallies=3, run_id=1):
    """``clients`` voters (partitions 0..clients-1, all liking candidate 5, pinning the committee) and 3 tally nodes
    after them (their keys in ``tmp_path``, kept across grids, as a tally's key is), in run ``run_id``."""
    scores = scores_table(clients + tallies)
    grid = LocalGrid(client_app(scores), clients + tallies, node_config=PERMISSIVE, silent=silent, run_id=run_id)
    addresses = ",".join(loopback_addresses(tallies))
    keys = []
    for j in range(tallies):
        path = tmp_path / f"tally-{j}.key"
        grid.contexts[node_id(clients + j)].node_config.update(
            {"dphype-tally-id": j, "dphype-tally-parties": addresses, "dphype-tally-key": str(path)})
        keys.append(load_tally_key(path).public)
    for i in range(clients):  # the voters' operators pin the committee (dphype-tallies)
        grid.contexts[node_id(i)].node_config["dphype-tallies"] = ",".join(key.hex() for key in keys)
    return grid, tuple(keys)


def argmax_config(**overrides) -> DPHypeConfig:
    """An argmax-release selection among :data:`CLIENTS` voters (k = 2, epsilon 4), with ``overrides``."""
    return DPHypeConfig(**{"epsilon": 4.0, "delta": 1e-5, "k": 2, "clients": CLIENTS, "release": "argmax",
                           **overrides})


# --- Released results ---------------------------------------------------------------------------------------------

CANDIDATES = candidate_grid(lr=[0.001, 0.01, 0.1, 1.0], steps=[5, 50])


def a_release(rule: str = "gp") -> DPHypeResult:
    """The result of a sum release among 20 clients over :data:`CANDIDATES`, with a fixed noisy vote sum."""
    request = make_vote_request(DPHypeConfig(epsilon=5.0, delta=1e-5, k=2, clients=20, rule=rule), CANDIDATES)
    votes = np.array([0.0, 1.0, 3.0, 6.0, 14.0, 12.0, 2.0, 2.0])  # noisy sum of 20 clients' top-2 votes
    return request.mode.release(request, votes, 20)


# --- Reference accuracies -----------------------------------------------------------------------------------------
# What the end-to-end tests compare a run with, computed from the data: the majority-class baseline (always predict
# the most frequent test label) and Opt (the best candidate's test accuracy after the same FedAvg the bundled app
# runs, DP-Hype Section V-C).


def majority_accuracy(labels: Any) -> float:
    """Accuracy of always predicting the most frequent of ``labels`` (integer class labels)."""
    labels = np.asarray(labels)
    return float(np.bincount(labels).max() / labels.size)


def majority_of_test_split(dataset: str) -> float:
    """:func:`majority_accuracy` of ``dataset``'s test split, on which the bundled app evaluates."""
    return majority_accuracy(load_cached(dataset)[1].y)


def candidate_accuracies(dataset: str, clients: int, candidates: Sequence[Mapping[str, Any]], *, rounds: int,
                         local_epochs: int, seed: int = 0) -> np.ndarray:
    """Test accuracy of every candidate after ``rounds`` FedAvg rounds of ``local_epochs`` over the ``clients``
    iid shards the bundled ClientApp trains on (batched, :func:`dphype.ml.training.fedavg`); Opt is the max."""
    shards = [make_task(dataset, i, clients, seed=seed, epochs=local_epochs).data for i in range(clients)]
    models = fedavg(MODEL_FOR_DATASET[dataset], shards, list(candidates), rounds=rounds, local_epochs=local_epochs,
                    seed=seed, device="cpu")
    return accuracy(models, load_cached(dataset)[1])


# --- Flower CLI processes -----------------------------------------------------------------------------------------

BIN = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin"
RESULT_PREFIX = "DPHYPE_RESULT "


def offline_env(flwr_home: Path) -> dict[str, str]:
    """Environment for reproducible offline Flower CLI runs (flower-facts.md); ``PYTHONPATH`` is this checkout,
    so every process Flower starts (SuperLink, SuperNodes, ServerApp, ClientApps) runs the code under test, not
    wherever the environment's ``dphype`` is installed from."""
    env = dict(os.environ)
    env.update(
        FLWR_HOME=str(flwr_home),
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(REPO),
    )
    return env


def processes_with(*fragments: str) -> list[int]:
    """PIDs of this user's processes whose command line contains every fragment."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if all(fragment in cmdline for fragment in fragments):
            pids.append(int(entry.name))
    return pids


def descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (children first found through /proc/*/stat)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def stop(pids: list[int], timeout: float = 10.0) -> None:
    """SIGTERM each PID, then SIGKILL what is still alive after ``timeout``."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            time.sleep(0.2)
        if Path(f"/proc/{pid}").exists():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def parse_result(output: str) -> dict:
    """The ServerApp's summary line."""
    lines = [line for line in output.splitlines() if RESULT_PREFIX in line]
    assert lines, f"no {RESULT_PREFIX.strip()} line in the output:\n{output[-3000:]}"
    return json.loads(lines[-1].split(RESULT_PREFIX, 1)[1])


# --- Bench studies ------------------------------------------------------------------------------------------------

#: The smallest study configuration (3 clients, iid and beta 5, 6 candidates, 1 epoch, 1 round).
TINY = ["--clients", "3", "--betas", "iid", "5", "--candidates", "6", "--epochs", "1", "--rounds", "1"]


def bench(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """Run ``python -m simulations ARGV --json`` in process; its JSON summary, after checking it wrote its outputs."""
    from simulations.cli import main

    assert main([*argv, "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["seconds"] > 0
    for path in result["outputs"]:
        assert Path(path).stat().st_size > 0
    return result
