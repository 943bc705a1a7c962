"""Plain helpers the test modules share (no test module imports another; pytest fixtures live in the
``conftest.py`` files). One section per kind of test:

- node policy and vote requests: :data:`PERMISSIVE`, :func:`make_request`;
- in-process Flower federations: :data:`CANDS`, :class:`TableTask`, :func:`scores_table`, :func:`client_app`,
  :func:`grid_of`, :func:`sum_config`; the argmax release's tally committee: :func:`argmax_grid`,
  :func:`argmax_config`;
- released results: :func:`a_release`;
- Flower CLI processes (``flwr run``, loopback deployment, the commands of the README and the docs): :data:`REPO`,
  :data:`BIN`, :data:`LOCAL_SUPERLINK_PORTS`, :func:`offline_env`, :func:`clean_env`, :func:`doc_blocks`,
  :func:`free_ports_in_a_row`, :func:`processes_with`, :func:`descendants`, :func:`stop`, :func:`parse_result`;
- the bench studies on a tiny configuration: :data:`TINY`, :func:`bench`;
- equality of two summation orders of one torch computation: :class:`Float64`, :func:`in_float64`, :data:`EXACT`.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import re
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from dphype.config import DPHypeConfig
from dphype.flower import register_dphype
from dphype.flower.local import LocalGrid, free_port, node_id
from dphype.flower.local import descendants as descendants  # the test modules stop process trees with it
from dphype.flower.tally_node import load_tally_key
from dphype.protocol import VoteRequest, make_vote_request
from dphype.result import DPHypeResult
from dphype.runs import RunFolder, runs_dir
from dphype.secure.committee import loopback_addresses
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


#: Node config of an operator who allows an unauthenticated federation (no roster).
UNAUTHENTICATED = {"dphype-allow-unauthenticated": True}


def argmax_grid(tmp_path, *, clients=CLIENTS, silent=(), tallies=3, run_id=1, federation=True):
    """``clients`` voters (partitions 0..clients-1, all liking candidate 5, pinning the committee) and 3 tally nodes
    after them (their keys in ``tmp_path``, kept across grids, as a tally's key is), in run ``run_id``; members of
    the grid's own roster (``federation``), or of an unauthenticated federation."""
    scores = scores_table(clients + tallies)
    grid = LocalGrid(client_app(scores), clients + tallies, node_config={**PERMISSIVE, **({} if federation else
                                                                                          UNAUTHENTICATED)},
                     silent=silent, run_id=run_id, federation=federation)
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


def a_run_folder() -> RunFolder:
    """A run folder in the test's runs folder (conftest's ``DPHYPE_RUNS_DIR``), as a ServerApp's ``main`` opens one."""
    return RunFolder.create(runs_dir({}), next(_RUN_IDS))


_RUN_IDS = itertools.count(1)


def a_release(rule: str = "gp") -> DPHypeResult:
    """The result of a sum release among 20 clients over :data:`CANDIDATES`, with a fixed noisy vote sum."""
    request = make_vote_request(DPHypeConfig(epsilon=5.0, delta=1e-5, k=2, clients=20, rule=rule), CANDIDATES)
    votes = np.array([0.0, 1.0, 3.0, 6.0, 14.0, 12.0, 2.0, 2.0])  # noisy sum of 20 clients' top-2 votes
    return request.mode.release(request, votes, 20)


# --- Flower CLI processes -----------------------------------------------------------------------------------------

#: The candidates of the bundled app's Flower runs on 5 Adult shards (tests/deployment/conftest.py's reference).
FIVE_SHARD_CANDIDATES = "table3:random:10:0"
BIN = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin"
RESULT_PREFIX = "DPHYPE_RESULT "


#: The environment variables that move ``flwr run``'s managed local SuperLink off its fixed ports (39091 / 39093),
#: so that a test's ``flwr run`` never joins a user's local SuperLink (flwr/cli/constant.py).
LOCAL_SUPERLINK_PORTS = ("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "FLWR_LOCAL_CONTROL_API_PORT")


def offline_env(flwr_home: Path) -> dict[str, str]:
    """Environment for reproducible offline Flower CLI runs (flower-facts.md); ``PYTHONPATH`` is this checkout,
    so every process Flower starts (SuperLink, SuperNodes, ServerApp, ClientApps) runs the code under test, not
    wherever the environment's ``dphype`` is installed from. A private ``FLWR_HOME``, free ports for ``flwr run``'s
    local SuperLink (:data:`LOCAL_SUPERLINK_PORTS`) and no inherited ``DPHYPE_*`` variable: a test's Flower run
    neither joins nor inherits anything of a user's."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("DPHYPE_")}
    env.update(
        FLWR_HOME=str(flwr_home),
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(REPO),
        **{name: str(free_port()) for name in LOCAL_SUPERLINK_PORTS},
    )
    return env


def free_ports_in_a_row(count: int) -> int:
    """The first of ``count`` consecutive ports that are free on 127.0.0.1 now (a script's base port, e.g. the
    deployment recipe's ``NODE_PORT``), away from Flower's defaults (9091-9099, 39091-39093)."""
    rng = np.random.default_rng()
    for _ in range(200):
        base = int(rng.integers(20000, 30000))
        try:
            for port in range(base, base + count):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no {count} consecutive free ports found")


def clean_env(home: Path, checkout: Path = REPO, **variables: str) -> dict[str, str]:
    """The environment of a new user's shell for running the docs' commands verbatim: this environment's ``bin`` and
    ``checkout``'s code, a fresh ``HOME`` and ``FLWR_HOME`` (``home/.flwr``, Flower's default under it), the given
    ``variables`` and none of those the other tests or the developer set."""
    home.mkdir(parents=True, exist_ok=True)
    return {"PATH": f"{BIN}{os.pathsep}/usr/local/bin:/usr/bin:/bin", "HOME": str(home),
            "FLWR_HOME": str(home / ".flwr"), "PYTHONPATH": str(checkout), "LANG": "C.UTF-8",
            "TMPDIR": os.environ.get("TMPDIR", "/tmp"), **variables}


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


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not yet reaped by its parent, does not)."""
    try:
        return (Path(f"/proc/{pid}") / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def stop(pids: list[int], timeout: float = 10.0) -> None:
    """SIGTERM each PID, then SIGKILL what is still running after ``timeout``."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline and running(pid):
            time.sleep(0.2)
        if running(pid):
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


#: The columns of a ``dphype bench ksweep`` run's ``ksweep.csv`` that the ballot-grid studies read.
KSWEEP_KEYS = ["dataset", "clients", "partition", "epsilon", "neighbouring", "k", "gap_points", "ci95", "within_1pt",
        "within_2pt"]


def write_sweep(folder: Path, dataset: str, best: dict[tuple[int, float], int], ks: range, slope: float = 1.0,
                gaps: Callable[[int], float] | None = None) -> Path:
    """A ksweep run of one iid federation per ``(n, epsilon)`` (replace-one): the gap is ``slope |k - best|`` (or
    ``gaps(k)``) and the share within 2 points ``1 - gap / 10`` (floored at 0)."""
    folder.mkdir(parents=True)
    with (folder / "ksweep.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, KSWEEP_KEYS)
        w.writeheader()
        for (n, eps), k_star in best.items():
            for k in ks:
                gap = slope * abs(k - k_star) if gaps is None else gaps(k)
                w.writerow({"dataset": dataset, "clients": n, "partition": "iid", "epsilon": eps,
                            "neighbouring": "replace-one", "k": k, "gap_points": gap, "ci95": 0.1, "within_1pt": 0.5,
                            "within_2pt": max(0.0, 1 - gap / 10)})
    return folder


def doc_blocks(page: str, section: str, language: str) -> list[str]:
    """The ``language`` code blocks of ``page`` (``README.md`` or a page of the documentation site, ``docs/*.md``)
    in its section headed ``## section`` or ``### section`` (up to the next heading of either level: a section's own
    blocks, not its subsections'), in order, exactly as written."""
    text = (REPO / page).read_text(encoding="utf-8")
    start = re.search(rf"^###? {re.escape(section)}\n", text, re.M)
    assert start is not None, f"{page} has no section {section!r}"
    end = re.compile(r"^###? ", re.M).search(text, start.end())
    body = text[start.end():end.start() if end else len(text)]
    return re.findall(rf"^```{language}\n(.*?)^```", body, re.S | re.M)


def sampled_noise(sampler, shape):
    """Draws from the exact law of the committee's MPC sampler (`dphype.privacy.winner.JointSampler.pmf`), by inverse
    CDF of the secure generator's uniforms: what the argmax release's audits add to the counts."""
    import numpy as np

    from dphype.privacy.noise import secure_generator

    support = np.arange(-(2**sampler.digits) + 1, 2**sampler.digits)
    cdf = np.cumsum(sampler.pmf(support))
    u = secure_generator().random(shape)
    return support[np.minimum(np.searchsorted(cdf, u * cdf[-1], side="right"), support.size - 1)]


# --- Equality of two summation orders of one torch computation ----------------------------------------------------


class Float64(torch.nn.Module):
    """``inner`` in float64, its float32 input widened exactly: forward, loss and training steps run in float64."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner.double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x.double())


def in_float64(factory: Callable[[], torch.nn.Module]) -> Callable[[], torch.nn.Module]:
    """``factory``'s models in float64 (`Float64`), for tests of equality between two code paths (batched and
    one at a time, stacked and plain, chunked and whole) that sum in different orders, to `EXACT`.

    In float32 the other order differs by a few ulps per operation, BLAS kernels (MKL's Intel and AMD paths, AVX2
    and AVX-512, thread counts) choose the order, and momentum and batch norm amplify it over training steps
    (CIFAR FedAvg after 14 steps: 4e-6 on an Intel Xeon, 8e-4 on an AMD EPYC, up to 1e4 ulps), so no float32
    tolerance both holds on every CPU and catches a real bug. In float64 the same amplification leaves about
    1e4 * 1.1e-16 = 1e-12 (measured: 1.3e-14 on the Xeon)."""
    return lambda: Float64(factory())


#: Tolerance of a float64 comparison of two summation orders (`in_float64`): 1e3 times the amplified rounding; a
#: wrong seed, batch order, fold, weighting or parameter moves weights, logits or losses by 1e-3 or more.
EXACT = 1e-9


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its parent to read its status has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")
