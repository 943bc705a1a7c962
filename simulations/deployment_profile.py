"""Where a loopback deployment's selection time goes: 1 SuperLink, N SuperNodes on 127.0.0.1, `flwr run . deploy`.

Starts ``flower-superlink`` and ``--nodes`` ``flower-supernode`` processes (loopback only, free ports, a private
``FLWR_HOME``) with the operators' scripts (``server/start-superlink.sh``, ``clients/start-voter.sh``,
``clients/start-tally.sh``), waits until every node registered, runs the bundled app of this checkout with ``flwr run``
(``PYTHONPATH`` is the checkout, so every process runs its code) and stamps every streamed log line with the time
it arrived. ``--release sum`` (default): the pre-flight and our SecAgg+ round. ``--release argmax`` (the app's
default): 3 more SuperNodes are the tallies (``clients/start-tally.sh``: ``dphype-tally-id``,
``dphype-tally-parties``, ``dphype-tally-key``), and only the winner's index is released. The stages come from
the ServerApp's own log lines (:mod:`dphype.flower.server` and its modules). ``--executor forkserver``
(default): every SuperNode runs with ``--isolation process`` beside a ``dphype superexec`` that forks its
ClientApp tasks from a warm process (:mod:`dphype.flower.superexec`;
the federation counts as started once every fork server has imported); ``--executor subprocess``: Flower's own
SuperExec, a fresh ``flwr-clientapp`` interpreter per message. The stages:

* ``start``: from ``flwr run`` to ``Starting DPHype`` (FAB upload, ServerApp process start and imports); in
  argmax mode to the committee's ``hello``, and ``committee`` from there to ``Starting DPHype`` (every node
  answers ``hello``; the planner's simulation runs here too);
* ``wait for nodes``: to the pre-flight being sent (all ``clients`` nodes connected);
* ``pre-flight``: every node checks the request and scores every candidate (ClientApp processes start here);
* sum mode: ``secure vote``, our SecAgg+ round (:func:`dphype.flower.server.secagg_server.run_secure_sum`), split into
  its stages (``secagg: share_keys``, ``secagg: masked_input``, ``secagg: consistency``, ``secagg: unmask``, as the
  server logs them) and ``release`` (decoding, the selection rule, the report); argmax mode: ``winner``, the sealed
  shares and the tallies' ``collect``, ``compute`` and ``result`` stages;
* ``selection``: the sum of the above from ``Starting DPHype`` (argmax mode: from the ``hello``), the
  deployment's selection time;
* ``fedavg``: the final training (one round, by default) until the result line.

Usage: ``python -m simulations.deployment_profile --nodes 10 --candidates table3 [--release argmax]
[--executor subprocess] [--json]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from dphype.flower.local import toml_value
from dphype.flower.tally_node import load_tally_key
from dphype.release import release_mode
from dphype.secure.roster import IdentityKey, Member, Roster

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

#: Per release mode: (stage, regular expression of the ServerApp log line that ends it), in order; the stages
#: between the first and ``fedavg`` make up the selection.
MARKERS: dict[str, tuple[tuple[str, str], ...]] = {
    "sum": (
        ("start", r"Starting DPHype\("),
        ("wait for nodes", r"DP-Hype pre-flight: sending the request"),
        ("pre-flight", r"DP-Hype pre-flight: \d+ of \d+ clients ready"),
        ("secure vote", r"DP-Hype secure vote: \d+ of \d+ clients contributed"),
        ("release", r"DP-Hype selected candidate"),
        ("fedavg", r"DPHYPE_RESULT "),
    ),
    "argmax": (
        ("start", r"DP-Hype tally hello: asking"),
        ("committee", r"Starting DPHype\("),
        ("wait for nodes", r"DP-Hype pre-flight: sending the request"),
        ("pre-flight", r"DP-Hype pre-flight: \d+ of \d+ clients ready"),
        ("winner", r"DP-Hype \(argmax\) selected candidate"),
        ("fedavg", r"DPHYPE_RESULT "),
    ),
}
#: Tally SuperNodes started beside the voters in argmax mode.
TALLIES = 3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


#: How a SuperNode starts its ClientApp tasks (the node scripts' ``--executor``): ``forkserver`` (default),
#: ``--isolation process`` and a ``dphype superexec`` beside it (:mod:`dphype.flower.superexec`: tasks forked from a
#: warm process); ``subprocess``, Flower's own SuperExec (a fresh ``flwr-clientapp`` interpreter per message).
EXECUTORS = ("forkserver", "subprocess")
#: The operators' scripts: the SuperLink's (server/) and each SuperNode role's (clients/).
SUPERLINK_SCRIPT = REPO / "server" / "start-superlink.sh"
NODE_SCRIPTS: dict[str, Path] = {"voter": REPO / "clients" / "start-voter.sh",
                                 "tally": REPO / "clients" / "start-tally.sh"}


def superlink_args(port: int, database: Path) -> list[str]:
    """The command line of a loopback SuperLink (``server/start-superlink.sh``, which also names it ``deploy`` in
    ``$FLWR_HOME/config.toml``)."""
    return [str(SUPERLINK_SCRIPT), "--insecure", "--host", "127.0.0.1", "--port", str(port), "--database",
            str(database)]


def supernode_args(link_port: int, role: Literal["voter", "tally"], options: Sequence[str],
                   executor: str = "forkserver") -> list[str]:
    """The command line of one loopback SuperNode (``clients/start-<role>.sh`` with the role's ``options``) on a
    free Runtime API port, its tasks started by ``executor`` (:data:`EXECUTORS`). One process: with the
    ``forkserver`` executor the script runs the SuperNode and its ``dphype superexec`` and stops both."""
    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}")
    return [str(NODE_SCRIPTS[role]), "--superlink", f"127.0.0.1:{link_port}", "--port", str(free_port()),
            "--insecure", "--executor", executor, *options]


def node_ready(log: str, executor: str) -> bool:
    """Whether a node script's log shows its SuperNode registered and, with the ``forkserver`` executor, its
    SuperExec's fork server done importing."""
    return "SuperNode ID:" in log and (executor == "subprocess" or "fork server ready" in log)


def write_node_config(path: Path, values: Mapping[str, Any]) -> Path:
    """A node-config TOML file (the scripts' ``--node-config``) with ``values``; ``path``."""
    path.write_text("".join(f"{key} = {toml_value(value)}\n" for key, value in values.items()), encoding="utf-8")
    return path


def write_roster(folder: Path, home: Path, voters: int, tallies: int) -> tuple[Path, list[Path], list[Path]]:
    """The federation's roster, as its operators make it with `dphype roster` (docs/deployment.md):
    an identity key per node in ``folder``, each tally's committee key where ``clients/start-tally.sh`` reads it
    (``home/dphype/tally-<j>.key``, created); returns the roster file and the voters' and tallies' identity files."""
    members: list[Member] = []
    identities: dict[str, list[Path]] = {"voter": [], "tally": []}
    for role, count in (("voter", voters), ("tally", tallies)):
        for i in range(count):
            key = IdentityKey.generate()
            identities[role].append(key.save(folder / f"{role}-{i}.id"))
            committee = load_tally_key(home / "dphype" / f"tally-{i}.key").public if role == "tally" else None
            members.append(Member(f"{role}-{i}", role, key.public, committee))
    roster = Roster("profile", tuple(members)).save(folder / "roster.json")
    return roster, identities["voter"], identities["tally"]


def wait_for_port(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout:g} s")


def stages(stamped: list[tuple[float, str]], started: float, release: str = "sum") -> dict[str, float]:
    """Seconds of each stage of :data:`MARKERS` from the stamped log lines (a missing marker ends the table)."""
    markers = MARKERS[release]
    out: dict[str, float] = {}
    previous = started
    for name, pattern in markers:
        hit = next((t for t, line in stamped if t >= previous and re.search(pattern, line)), None)
        if hit is None:
            break
        out[name] = hit - previous
        previous = hit
    if markers[-2][0] in out:
        out["selection"] = sum(out[name] for name, _ in markers[1:-1])
        if not release_mode(release).uses_committee:
            line = next(line for _, line in stamped if re.search(markers[3][1], line))
            for stage, seconds in re.findall(r"(\w+) (\d+\.\d+) s", line):
                out[f"secagg: {stage}"] = float(seconds)
    return out


def uses_committee(release: str) -> bool:
    """Whether the release mode named ``release`` sends its ballots to a tally committee."""
    return release_mode(release).uses_committee


def profile(nodes: int, candidates: str, epsilon: float, local_epochs: int, timeout: float,
            release: str = "sum", log_file: str | None = None, executor: str = "forkserver") -> dict[str, Any]:
    """Start the federation, run the app once, return the stage table and the run's summary (``log_file``: also
    write the ServerApp's streamed log there, each line with its second since ``flwr run``)."""
    with tempfile.TemporaryDirectory(prefix="dphype-deploy-") as folder:
        tmp = Path(folder)
        home = tmp / "flwr-home"
        home.mkdir()
        link = free_port()
        env = {**os.environ, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
               "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "OMP_NUM_THREADS": "1",
               "PYTHONPATH": str(REPO), "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        procs: list[subprocess.Popen] = []
        logs: list[Path] = []

        def start(name: str, args: list[str]) -> None:
            logs.append(tmp / f"{name}.log")
            procs.append(subprocess.Popen(args, env=env, stdout=logs[-1].open("w"), stderr=subprocess.STDOUT,
                                          start_new_session=True))

        try:
            begun = time.perf_counter()
            start("superlink", superlink_args(link, tmp / "state.db"))
            wait_for_port(link)
            policy = write_node_config(tmp / "policy.toml", {
                "dphype-max-epsilon": epsilon, "dphype-min-clients": nodes, "dphype-min-neighbours": 2,
                "dphype-lifetime-epsilon": 10 * epsilon})
            tallies = TALLIES if uses_committee(release) else 0
            roster, voter_ids, tally_ids = write_roster(tmp, home, nodes, tallies)
            for i in range(nodes):
                start(f"supernode-{i}", supernode_args(link, "voter", [
                    "--partition-id", str(i), "--num-partitions", str(nodes), "--node-config", str(policy),
                    "--roster", str(roster), "--identity", str(voter_ids[i])], executor))
            if tallies:  # one SuperNode per tally, its key $FLWR_HOME/dphype/tally-<j>.key
                committee = write_node_config(tmp / "committee.toml", {"dphype-tally-parties": ",".join(
                    f"127.0.0.1:{free_port()}" for _ in range(tallies))})
                for j in range(tallies):
                    start(f"tally-{j}", supernode_args(link, "tally", [
                        "--tally-id", str(j), "--node-config", str(committee), "--roster", str(roster),
                        "--identity", str(tally_ids[j])], executor))
            deadline = time.monotonic() + 300
            while not all(node_ready(log.read_text(errors="replace"), executor) for log in logs[1:]):
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    raise RuntimeError("the SuperNodes did not all register:\n" + "\n".join(
                        log.read_text(errors="replace")[-500:] for log in logs))
                time.sleep(0.2)
            federation_seconds = time.perf_counter() - begun
            result_file = tmp / "result.json"
            run_config = (f"clients={nodes} epsilon={epsilon} candidates='{candidates}' release='{release}' "
                          f"fedavg-rounds=1 local-epochs={local_epochs} fraction-evaluate=0.0 "
                          f"result-file='{result_file}' round-timeout={timeout / 4:g}")
            started = time.perf_counter()
            run = subprocess.Popen([str(BIN / "flwr"), "run", str(REPO), "deploy", "--stream", "--run-config",
                                    run_config], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True)
            procs.append(run)
            stamped = []
            assert run.stdout is not None
            for line in run.stdout:
                stamped.append((time.perf_counter(), line.rstrip()))
                if time.perf_counter() - started > timeout:
                    break
            code = run.wait(timeout=60)
            total = time.perf_counter() - started
            if log_file:
                Path(log_file).write_text("".join(f"{t - started:8.2f} {line}\n" for t, line in stamped))
        finally:
            for proc in reversed(procs):  # each in its own session: its group holds what it started
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
        if code != 0 or not result_file.exists():
            raise RuntimeError(f"the run failed (flwr run exited {code}) after the stages "
                               f"{json.dumps(stages(stamped, started, release))}:\n"
                               + "\n".join(line for _, line in stamped[-40:]))
        summary = json.loads(result_file.read_text())
    return {"nodes": nodes, "release": release, "executor": executor,
            "tallies": TALLIES if uses_committee(release) else 0, "candidates": summary["num_candidates"],
            "local_epochs": local_epochs,
            "federation_start_seconds": federation_seconds, "run_seconds": total,
            "stages": stages(stamped, started, release), "selected_index": summary["selected_index"],
            "accuracy": summary["accuracy"], "epsilon": summary["privacy"]["epsilon"]}


def group_cpu_seconds(groups: set[int]) -> float:
    """CPU seconds (user + system) used so far by the live processes of these process groups."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) in groups:  # pgrp; fields[11], fields[12]: utime, stime in clock ticks
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def idle_cpu(executor: str, seconds: float, poll_interval: float | None = None) -> tuple[float, float]:
    """CPU seconds one idle SuperNode with its SuperExec, and the SuperLink, use in ``seconds`` (no run): the
    cost of waiting for tasks, Flower's SuperExec against ``dphype superexec`` at ``poll_interval``."""
    with tempfile.TemporaryDirectory(prefix="dphype-idle-") as folder:
        env = {**os.environ, "FLWR_HOME": folder, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
               "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
               "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        link = free_port()
        node = ["--partition-id", "0", "--num-partitions", "1"]
        if poll_interval is not None and executor == "forkserver":
            node += ["--poll-interval", f"{poll_interval:g}"]
        commands = [superlink_args(link, Path(folder) / "state.db"), supernode_args(link, "voter", node, executor)]
        procs = []
        try:
            for args in commands:
                procs.append(subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                              start_new_session=True))
                if len(procs) == 1:
                    wait_for_port(link)
            time.sleep(30)  # registered, fork server started
            node_groups, link_group = {proc.pid for proc in procs[1:]}, {procs[0].pid}
            before = group_cpu_seconds(node_groups), group_cpu_seconds(link_group)
            time.sleep(seconds)
            return group_cpu_seconds(node_groups) - before[0], group_cpu_seconds(link_group) - before[1]
        finally:
            for proc in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10, help="SuperNodes (default 10)")
    parser.add_argument("--candidates", default="table3", help="candidate spec (default table3: 100 candidates)")
    parser.add_argument("--epsilon", type=float, default=1.0, help="selection epsilon (default 1)")
    parser.add_argument("--local-epochs", type=int, default=5, help="local epochs of the scoring (default 5)")
    parser.add_argument("--timeout", type=float, default=1200.0, help="give up after this many seconds")
    parser.add_argument("--release", choices=sorted(MARKERS), default="sum",
                        help=f"sum (default) or argmax ({TALLIES} more SuperNodes are the tallies)")
    parser.add_argument("--executor", choices=EXECUTORS, default="forkserver",
                        help="forkserver (default: a warm `dphype superexec` per SuperNode, --isolation process) or "
                             "subprocess (Flower's SuperExec: a fresh interpreter per message)")
    parser.add_argument("--log", default=None, help="write the ServerApp's log here, each line with its time")
    parser.add_argument("--json", action="store_true", help="print one JSON line at the end")
    parser.add_argument("--idle", type=float, default=None, metavar="SECONDS",
                        help="instead of a run: CPU seconds one idle SuperNode and its SuperExec use in SECONDS, "
                             "Flower's SuperExec and dphype superexec at poll intervals 0.1 / 0.5 / 1 s")
    args = parser.parse_args(argv)
    if args.idle is not None:
        rows = [("subprocess", None, idle_cpu("subprocess", args.idle))]
        rows += [("forkserver", interval, idle_cpu("forkserver", args.idle, interval)) for interval in (0.1, 0.5, 1.0)]
        for executor, interval, (node, link) in rows:
            print(f"  {executor:10s} poll {interval or 1.0:g} s: SuperNode + SuperExec {node:.2f} CPU s, SuperLink "
                  f"{link:.2f} CPU s in {args.idle:g} s idle")
        if args.json:
            print(json.dumps([{"executor": e, "poll_interval": i, "node_cpu_seconds": n, "superlink_cpu_seconds": k}
                              for e, i, (n, k) in rows]))
        return 0
    out = profile(args.nodes, args.candidates, args.epsilon, args.local_epochs, args.timeout, args.release,
                  args.log, args.executor)
    print(f"{out['nodes']} voting SuperNodes (+{out['tallies']} tallies) on loopback, release={out['release']}, "
          f"executor={out['executor']}, "
          f"{out['candidates']} candidates, {out['local_epochs']} local epochs; federation started in "
          f"{out['federation_start_seconds']:.1f} s, `flwr run` took {out['run_seconds']:.1f} s")
    for name, seconds in out["stages"].items():
        print(f"  {name:26s} {seconds:7.1f} s")
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
