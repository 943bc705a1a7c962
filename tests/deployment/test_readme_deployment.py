"""The deployment recipe (docs/deployment.md, "Deploying the bundled app"), run as written: its two command blocks, on
a copy of the repository, with a fresh HOME (so a fresh ~/.flwr), free ports for the recipe's port variables and no
variable of the other tests; then a run the server refuses before any client works."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import REPO, clean_env, descendants, doc_blocks, free_ports_in_a_row, parse_result, stop

from dphype.node.ledger import Ledger
from dphype.privacy.winner import WINNER_NOISE
from dphype.selection.candidates import load_candidates

#: The run config the copy's pyproject.toml gives the app (the recipe's own command sets only clients=3): the
#: same recipe on a smaller search, for the test suite's time; result-file, relative, lands on the SuperLink's host
#: in the folder it was started from.
SMALL_RUN = {"candidates": "table3:random:10:0", "k": 3, "local-epochs": 1, "fedavg-rounds": 1,
             "fraction-evaluate": 0.0, "round-timeout": 240.0, "connect-timeout": 300.0, "result-file": "result.json"}
#: The recipe's port variables and how many consecutive ports each names.
PORTS = {"LINK_PORT": 1, "NODE_PORT": 6, "MPYC_PORT": 3}


def readme_deployment() -> tuple[str, str]:
    """The guide's two deployment blocks: the port variables' and the recipe's."""
    ports, recipe = doc_blocks("docs/deployment.md", "Deploying the bundled app", "bash")
    assert "export LINK_PORT=" in ports and "server/start-superlink.sh --ssl-ca-certfile \"$KEYS/pki/ca.pem\"" in recipe
    assert "--insecure" not in recipe  # TLS and node authentication on every connection
    return ports, recipe


def copy_of_the_repository(folder: Path) -> Path:
    """The checkout's files (tracked and new, as a fresh clone of this working tree has them), with the app's
    run-config defaults set to `SMALL_RUN`."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(source.read_bytes())
            (folder / name).chmod(source.stat().st_mode)
    pyproject = folder / "pyproject.toml"
    text = pyproject.read_text(encoding="utf-8")
    for key, value in SMALL_RUN.items():
        text, count = re.subn(rf"^{key} = .*$", f"{key} = {json.dumps(value)}", text, count=1, flags=re.M)
        assert count == 1, f"pyproject.toml's run config has no {key}"
    pyproject.write_text(text, encoding="utf-8")
    return folder


def run_block(script: str, cwd: Path, env: dict[str, str], log: Path, timeout: float) -> tuple[int, int | None, str]:
    """``bash -c script`` in a process group of its own; the group, the exit status (``None`` after ``timeout``
    seconds) and the output. Whatever it leaves running in the background (the recipe's SuperLink and SuperNodes)
    is the caller's to stop (`stop_group`)."""
    with open(log, "w") as out:
        proc = subprocess.Popen(["bash", "-c", script], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        code = None
    return proc.pid, code, log.read_text(errors="replace")


def stop_group(leader: int) -> None:
    """SIGTERM the process group ``leader`` started (the recipe's background jobs), then SIGKILL what is left."""
    pids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _group(int(p.name)) == leader]
    try:
        os.killpg(leader, signal.SIGTERM)
    except ProcessLookupError:
        return
    stop(pids + [d for pid in pids for d in descendants(pid)], timeout=15.0)


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


@pytest.mark.slow
@pytest.mark.deployment
def test_the_readme_deployment_recipe_runs_as_written(tmp_path):
    ports_block, recipe = readme_deployment()
    # the test sets exactly the variables the recipe's first block exports, to free ports of this machine
    assert re.fullmatch(r"# .*\nexport LINK_PORT=\d+ NODE_PORT=\d+ MPYC_PORT=\d+\n", ports_block), ports_block
    ports = {name: free_ports_in_a_row(count) for name, count in PORTS.items()}
    checkout = copy_of_the_repository(tmp_path / "clone")
    tracked = [path for path in checkout.rglob("*") if path.is_file()]
    home = tmp_path / "home"
    home.mkdir()
    keys = home / ".flwr" / "dphype" / "federation"  # the recipe's $KEYS in this HOME
    # a user's shell (its own HOME, so a fresh ~/.flwr), the recipe's port variables, Flower's offline switches;
    # PYTHONPATH is the copy, so every process runs its code (as an install of that clone would)
    env = clean_env(home, checkout, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1",
                    **{name: str(port) for name, port in ports.items()})
    started = time.monotonic()
    group, code, output = run_block(recipe, checkout, env, tmp_path / "recipe.log", timeout=540)
    try:
        seconds = time.monotonic() - started
        assert code == 0, f"exit status {code} after {seconds:.0f} s\n{output[-4000:]}"
        result = parse_result(output)
        # the ServerApp's summary() in the log, with the pure guarantee worded as such
        assert "DP-Hype run summary:" in output and f"DP-Hype selected candidate {result['selected_index']}" in output
        assert "privacy: (1, 2e-19)-DP per client (replace-one, report-noisy-max" in output
        assert output.count("DP-Hype plan: ") == 1 and "DP-Hype plan: 10 candidates, 3 voters, epsilon " in output
        # only the winner's index, by the three tallies, among the three voters
        assert result["best_params"] == load_candidates(SMALL_RUN["candidates"])[result["selected_index"]]
        assert result["noisy_sum"] is None and result["confidence"] is None
        privacy = result["privacy"]
        assert privacy["release_delta"] < 1e-18 and privacy["noise"] == WINNER_NOISE and privacy["survivors"] == 3
        assert privacy["released"].startswith("winning index only (secure argmax among 3 tallies")
        # every tally's MPyC party runs with TLS (its node config names its certificate folder); every node
        # authenticated to the SuperLink with a key its operator registered
        assert output.count("dphype-tally-tls=") == 3 and output.count("register-nodes.sh: registered") == 6
        # each node's doctor check before it started: TLS, its node key, its roster membership; a voter's ledger
        for script, count in (("start-voter.sh", 3), ("start-tally.sh", 3)):
            assert output.count(f"{script}: transport: TLS, SuperLink verified with {keys}/pki/ca.pem") == count
            assert output.count(f"{script}: federation: roster ") == count
        assert output.count("start-voter.sh: ledger: ") == 3 and output.count("start-tally.sh: mpyc: TLS") == 3
        # the federation of the recipe's roster: 3 voters and 3 tallies, said in the result and its summary
        assert re.fullmatch(r"roster [0-9a-f-]{19} \(6 members\)", result["federation"])
        assert f"federation: {result['federation']}" in output
        # result-file: on the SuperLink's host, relative to the folder it was started from
        assert json.loads((checkout / "result.json").read_text()) == result
        # per-node files in the fresh ~/.flwr: one ledger per voter (its one pure-epsilon vote), one key per tally
        flwr_home = home / ".flwr"
        # no key, certificate or identity in the checkout; the recipe's private keys are the owner's only
        written = {path for path in checkout.rglob("*") if path.is_file()} - set(tracked)
        assert not [p for p in written if p.suffix in (".key", ".id", ".pem", ".crt", ".pub")], sorted(written)
        private = [*keys.rglob("*.key"), *keys.glob("*.id")]
        assert len(private) == 2 + 3 + 6 and all(p.stat().st_mode & 0o777 == 0o600 for p in private), private
        for i in range(3):  # the vote, then the private evaluation of the final model
            vote, evaluation = Ledger(flwr_home / "dphype" / f"ledger-partition-{i}.json").entries()
            assert (vote.release, vote.noise, vote.epsilon) == ("vote", WINNER_NOISE, pytest.approx(1.0))
            assert evaluation.release == "evaluation" and evaluation.epsilon == pytest.approx(0.5, rel=1e-3)
        keys = [(flwr_home / "dphype" / f"tally-{j}.key").read_bytes() for j in range(3)]
        assert len(set(keys)) == 3
        assert "[superlink.deploy]" in (flwr_home / "config.toml").read_text()

        # a candidate key the app's task does not use: refused by the server before any client works; run.sh
        # exits 1 with the cause as its last line
        (checkout / "bad.json").write_text(json.dumps([{"lr": 0.1, "batch": 32}, {"lr": 0.01, "batch": 32}]))
        refused, code, failed = run_block("""server/run.sh deploy --run-config "clients=3 candidates='bad.json'" """,
                                          checkout, env, tmp_path / "refused.log", timeout=180)
        stop_group(refused)
        assert code == 1, failed[-3000:]
        last = failed.strip().splitlines()[-1]
        assert last.startswith("run.sh: DP-Hype: the run failed: ValueError: run config candidates='bad.json'"), last
        assert "'batch'" in last and "lr, momentum, decay" in last and "candidates='table3'" in last
        assert "pre-flight" not in failed  # no client was asked anything
    finally:
        stop_group(group)
