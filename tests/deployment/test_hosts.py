"""A federation on hosts that are really apart: one network namespace per SuperLink, voter and tally, created
by the test (a private 10.231.0.0/24 behind a bridge in a namespace of its own, torn down at the end), each node
started by its operator's script with TLS, SuperNode authentication, MPyC TLS and the roster, its own FLWR_HOME.
One federation started once, every SuperNode connected before the first run, serves the runs: the sum release
over SecAgg+ (the tallies are connected and answer the server's hello as tallies: the voters are sampled among the
others) completes with the final training; the committee's argmax release does too, with a voter whose link is cut
mid-selection a dropout (and, when measuring, i.e. with ``DPHYPE_HOSTS_VOTERS`` set, first with every voter).
Each run prints its time from submission to a result and where it went (not asserted). Flower's own waits are
part of every stage: an idle SuperNode sleeps 3 s between two pulls and polls for its ClientApp's reply every
0.5 s, each run's ServerApp is a fresh interpreter, the ServerApp's log reaches ``flwr run --stream`` in bursts,
and the SuperLink sees a node cut off only when its heartbeats stop; a cut-off voter's pre-flight answer is waited
for until the round timeout. ``DPHYPE_HOSTS_VOTERS`` sets the number of voters (default 4; the measured
configuration is 10)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers import REPO, clean_env, descendants, parse_result, stop

pytestmark = [pytest.mark.slow, pytest.mark.deployment]  # one federation (module fixture) serves the runs

SUBNET = "10.231.0"
LINK = f"{SUBNET}.1"
VOTERS, TALLIES = int(os.environ.get("DPHYPE_HOSTS_VOTERS", "4")), 3
PORT, RUNTIME_PORT, MPYC_PORT = 9092, 9094, 7000
#: Seconds per stage of a run whose nodes all answer: the bound of a stuck run, never waited for otherwise.
ROUND_TIMEOUT = 120.0
#: The cut-off run's seconds per stage, derived from the work: CUT_MARGIN times the slowest stage of the runs before
#: it on this federation (`Federation.cut_timeout`), at least CUT_FLOOR. The cut voter's pre-flight answer is waited
#: for this long (or until the SuperLink finds its heartbeats missing), so it bounds that run; every other stage of
#: that run must end within it, as it did (CUT_MARGIN times faster) in the runs before, whatever the machine and
#: its load.
CUT_MARGIN, CUT_FLOOR = 3.0, 10.0
#: Whether the times are being measured (every run, each release with every voter).
MEASURING = "DPHYPE_HOSTS_VOTERS" in os.environ
RUN = {"candidates": "'table3:random:10:0'", "k": 3, "local-epochs": 1, "fedavg-rounds": 1,
       "fraction-evaluate": 0.0, "clients": VOTERS, "dropout": 0.25, "round-timeout": ROUND_TIMEOUT,
       "connect-timeout": 240.0,
       # a plumbing test of 4 voters: below the planner's min-success, and no private evaluation after a cut-off
       "min-success": 0.0, "private-evaluation": "false"}


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


class Hosts:
    """Network namespaces ``name -> address`` on one bridge; every process started in them is stopped by PID."""

    def __init__(self, tag: str) -> None:
        self.tag, self.names, self.procs, self.links = tag, {}, [], {}
        self.switch = f"{tag}-sw"
        ip("netns", "add", self.switch)
        self.names[self.switch] = None
        self.exec(self.switch, "ip", "link", "add", "br0", "type", "bridge")
        self.exec(self.switch, "ip", "link", "set", "br0", "up")

    def ns(self, host: str) -> str:
        return f"{self.tag}-{host}"

    def exec(self, ns: str, *cmd: str) -> None:
        ip("netns", "exec", ns, *cmd)

    def add(self, host: str, address: str) -> None:
        ns, k = self.ns(host), len(self.names)
        self.links[host] = f"{self.tag}s{k}"
        ip("netns", "add", ns)
        self.names[ns] = address
        outer, inner = f"{self.tag}s{k}", f"{self.tag}h{k}"
        ip("link", "add", inner, "type", "veth", "peer", "name", outer)
        ip("link", "set", inner, "netns", ns)
        ip("link", "set", outer, "netns", self.switch)
        self.exec(self.switch, "ip", "link", "set", outer, "master", "br0")
        self.exec(self.switch, "ip", "link", "set", outer, "up")
        self.exec(ns, "ip", "link", "set", inner, "name", "eth0")
        self.exec(ns, "ip", "addr", "add", f"{address}/24", "dev", "eth0")
        self.exec(ns, "ip", "link", "set", "eth0", "up")
        self.exec(ns, "ip", "link", "set", "lo", "up")

    def cut(self, host: str) -> None:
        """Cut ``host`` off: its link to the bridge goes down (no reset reaches anyone; its peers just hear nothing)."""
        self.exec(self.switch, "ip", "link", "set", self.links[host], "down")

    def start(self, host: str, script: str, env: dict[str, str], log: Path) -> subprocess.Popen:
        with open(log, "w") as out:
            proc = subprocess.Popen(["ip", "netns", "exec", self.ns(host), "bash", "-c", script], cwd=REPO, env=env,
                                    stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def run(self, host: str, script: str, env: dict[str, str], timeout: float = 120) -> str:
        out = subprocess.run(["ip", "netns", "exec", self.ns(host), "bash", "-c", script], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, f"{host}: {script}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
        return out.stdout

    def close(self) -> None:
        stop([d for p in self.procs for d in reversed(descendants(p.pid))] + [p.pid for p in self.procs])
        for ns in self.names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _namespaces_available() -> bool:
    if shutil.which("ip") is None or os.geteuid() != 0:
        return False
    probe = f"dphprobe{os.getpid() % 100000}"
    ok = subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode == 0
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ok


@dataclass
class Federation:
    """The started federation: its hosts, where its logs go, and each run's time to a result."""

    hosts: Hosts
    folder: Path
    env: dict[str, str]
    link: subprocess.Popen
    seconds: dict[str, float] = field(default_factory=dict)
    #: The slowest stage so far, as the first voter saw it: from receiving one message to receiving the next (its
    #: work, the slowest voter's, the server's and Flower's pulls in between).
    slowest_stage: float = 0.0

    def cut_timeout(self) -> float:
        """A stage timeout for the cut-off run: `CUT_MARGIN` times the slowest stage so far, at least `CUT_FLOOR`
        (twice that before any run)."""
        return max(CUT_FLOOR, CUT_MARGIN * self.slowest_stage) if self.slowest_stage else 2 * CUT_FLOOR

    def run(self, name: str, cut: str | None = None, **overrides: object) -> dict:
        """Submit one run of the bundled app; with ``cut`` that host's link goes down once it receives the pre-flight.

        Flower streams the ServerApp's log in bursts, so its stamps say when a line arrived, not when it was written;
        the first voter's and the first tally's SuperNode logs arrive as they are written, and their stamped
        ``Receiving``/``Sending`` lines say when each stage reached a node and when its answer left.
        """
        runs = {"runs-dir": f"'{self.folder / 'runs'}'"}  # the run folders: the test's, not the checkout's
        config = " ".join(f"{k}={v}" for k, v in {**RUN, **runs, **overrides}.items())
        log = self.folder / f"run-{name}.log"
        watched = self.folder / f"{cut}.log"  # the node to cut: cut once its SuperNode receives the pre-flight
        seen = len(watched.read_text(errors="replace")) if cut is not None else 0
        nodes = {host: self.folder / f"{host}.log" for host in ("voter-0", f"tally-{TALLIES - 1}")}
        offsets = {host: len(path.read_text(errors="replace")) for host, path in nodes.items()}
        started = time.monotonic()
        submit = self.hosts.start("link", f'server/run.sh deploy --wait 60 --run-config "{config}"', self.env, log)
        stamped: list[tuple[float, str]] = []  # when each log line appeared: where the time went
        server_lines = 0
        while True:
            done = submit.poll() is not None
            now = time.monotonic() - started
            lines = log.read_text(errors="replace").splitlines()
            stamped += [(now, line) for line in lines[server_lines:]]
            server_lines = len(lines)
            for host, path in nodes.items():
                text = path.read_text(errors="replace")
                stamped += [(now, f"[{host}] {line}") for line in text[offsets[host]:].splitlines()
                            if "Receiving:" in line or "Sending:" in line]
                offsets[host] = len(text)
            if cut is not None and "Receiving: query.dphype message" in watched.read_text(errors="replace")[seen:]:
                self.hosts.cut(cut)
                cut = None
            if done or time.monotonic() - started > 600:
                break
            time.sleep(0.2)
        code = submit.wait(timeout=10)
        self.seconds[name] = time.monotonic() - started
        received = [t for t, line in stamped if line.startswith("[voter-0]") and "Receiving:" in line]
        self.slowest_stage = max([self.slowest_stage, *(b - a for a, b in zip(received, received[1:]))])
        (self.folder / f"profile-{name}.txt").write_text("".join(f"{t:7.1f} {line}\n" for t, line in stamped))
        print("\n".join(f"  {t:6.1f} s {line[:150]}" for t, line in stamped if any(
            mark in line for mark in ("DP-Hype", "[ROUND", "Starting", "waiting for nodes", "Waiting for",
                                      "Receiving:", "Sending:"))))
        output = log.read_text(errors="replace")
        tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                          for p in sorted(self.folder.glob("*.log")) if not p.name.startswith("run-"))
        assert code == 0, f"run.sh exited {code} after {self.seconds[name]:.0f} s\n{output[-4000:]}\n{tails}"
        print(f"time to a result on separate hosts ({name}, {VOTERS} voters, {TALLIES} tallies): "
              f"{self.seconds[name]:.1f} s")
        return parse_result(output)


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    """A SuperLink, the voters and the tallies, each on its own host, started by their operators' scripts."""
    if not _namespaces_available():
        pytest.skip("needs root and `ip netns` (network namespaces)")
    tmp_path = tmp_path_factory.mktemp("hosts")
    hosts = Hosts(f"dh{os.getpid() % 10000}")
    shared = tmp_path / "shared"  # what the operators exchange: the CA and certificates, the roster, the committee
    shared.mkdir()
    homes = {}

    def env(host: str) -> dict[str, str]:
        homes.setdefault(host, tmp_path / host)
        return clean_env(homes[host], REPO, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1",
                         OMP_NUM_THREADS="1")

    try:
        phases = {"start": time.monotonic()}
        hosts.add("link", LINK)
        names = [f"voter-{i}" for i in range(VOTERS)] + [f"tally-{j}" for j in range(TALLIES)]
        address = {name: f"{SUBNET}.{10 + k}" for k, name in enumerate(names)}
        for name in names:
            hosts.add(name, address[name])
        phases["namespaces"] = time.monotonic()
        root = env("link")
        hosts.run("link", f"server/make-certificates.sh {shared}/pki --superlink-host {LINK} --tallies {TALLIES}"
                          f" && dphype roster init --federation hosts --out {shared}/roster.json", root)
        parties = ",".join(f"{address[f'tally-{j}']}:{MPYC_PORT}" for j in range(TALLIES))
        (shared / "committee.toml").write_text(f'dphype-tally-parties = "{parties}"\n')
        envs = {name: env(name) for name in names}

        def own_keys(name: str) -> list[str]:
            """On the operator's own host: its identity, its node key's public file and (a tally) its committee key."""
            role, index = name.split("-")
            flag = "--partition-id" if role == "voter" else "--tally-id"
            tally_key = f" && clients/start-tally.sh --print-public-key --tally-id {index}" if role == "tally" else ""
            out = hosts.run(name, f"dphype roster keygen --name {name} --out $HOME/id >/dev/null && "
                                  f"clients/start-{role}.sh --print-node-key {flag} {index}{tally_key}", envs[name])
            return out.strip().splitlines()[-2 if tally_key else -1:]

        with ThreadPoolExecutor(max_workers=4) as pool:  # the operators work at the same time, each on its own host
            own = dict(zip(names, pool.map(own_keys, names), strict=True))
        for name in names:  # one at a time: each operator adds its member to the shared roster file
            role = name.split("-")[0]
            tally_key = f" --tally-key {own[name][1]}" if role == "tally" else ""
            hosts.run(name, f"dphype roster add {shared}/roster.json --name {name} --role {role} "
                            f'--identity "$(cat $HOME/id.pub)"{tally_key} >/dev/null', envs[name])
        keys = [own[name][0] for name in names]
        phases["identities"] = time.monotonic()
        link = hosts.start("link", f"server/start-superlink.sh --ssl-ca-certfile {shared}/pki/ca.pem "
                                   f"--ssl-certfile {shared}/pki/superlink.pem --ssl-keyfile {shared}/pki/superlink.key"
                                   f" --host 0.0.0.0 --port {PORT} --address {LINK}:{PORT}", root,
                           tmp_path / "link.log")
        hosts.run("link", f"server/register-nodes.sh deploy {' '.join(keys)}", root, timeout=300)
        phases["superlink"] = time.monotonic()
        common = f"--superlink {LINK}:{PORT} --port {RUNTIME_PORT} --root-certificates {shared}/pki/ca.pem " \
                 f"--roster {shared}/roster.json --identity $HOME/id"
        for i in range(VOTERS):
            hosts.start(f"voter-{i}", f"clients/start-voter.sh {common} --partition-id {i} --num-partitions {VOTERS}"
                                      " --node-config clients/examples/policy-small-federation.toml",
                        env(f"voter-{i}"), tmp_path / f"voter-{i}.log")
        for j in range(TALLIES):
            hosts.start(f"tally-{j}", f"clients/start-tally.sh {common} --tally-id {j} --node-config "
                                      f"{shared}/committee.toml --mpyc-tls {shared}/pki/tally-{j}",
                        env(f"tally-{j}"), tmp_path / f"tally-{j}.log")
        _wait_online(hosts, root, VOTERS + TALLIES)
        phases["supernodes online"] = time.monotonic()
        print("federation set-up: " + ", ".join(f"{b} {phases[b] - phases[a]:.1f} s" for a, b in
                                                 zip(phases, list(phases)[1:])))
        yield Federation(hosts, tmp_path, root, link)
    finally:
        hosts.close()


def _wait_online(hosts: Hosts, env: dict[str, str], count: int, timeout: float = 300.0) -> None:
    """Wait until the SuperLink lists ``count`` SuperNodes online (`flwr supernode list`), so no run waits for one."""
    script = ("import json, subprocess, sys, time\n"
              "deadline = time.monotonic() + float(sys.argv[2])\n"
              "while True:\n"
              "    out = subprocess.run(['flwr', 'supernode', 'list', 'deploy', '--format', 'json'],"
              " capture_output=True, text=True).stdout\n"
              "    nodes = json.loads(out[out.index('{'):]).get('nodes', []) if '{' in out else []\n"
              "    online = sum(node.get('status') == 'online' for node in nodes)\n"
              "    if online >= int(sys.argv[1]) or time.monotonic() > deadline:\n"
              "        print(online); break\n"
              "    time.sleep(2)\n")
    online = int(hosts.run("link", f"python3 -c {shlex.quote(script)} {count} {timeout}", env,
                           timeout=timeout + 60).split()[-1])
    assert online >= count, f"only {online} of {count} SuperNodes connected within {timeout:g} s"


def _federation_line(result: dict) -> None:
    assert result["federation"].startswith("roster ") and f"({VOTERS + TALLIES} members)" in result["federation"]


def test_the_sum_release_over_secagg_on_separate_hosts(federation):
    result = federation.run("sum", release="'sum'")
    assert result["privacy"]["survivors"] == VOTERS and "secure_sum" in result and result["noisy_sum"] is not None
    assert result["selected_index"] in range(10) and result["accuracy"] > 0.0
    _federation_line(result)


@pytest.mark.skipif(not MEASURING, reason="measured with DPHYPE_HOSTS_VOTERS set; the cut-off run below completes "
                                          "the same release on the same hosts")
def test_the_committee_argmax_release_on_separate_hosts(federation):
    result = federation.run("argmax", release="'argmax'")
    assert result["privacy"]["survivors"] == VOTERS
    assert result["privacy"]["released"].startswith(f"winning index only (secure argmax among {TALLIES} tallies")
    _federation_line(result)
    assert federation.link.poll() is None  # the SuperLink still serves


def test_a_voter_cut_off_mid_selection_is_a_dropout_and_the_run_completes(federation):
    # dropout=0.25: at least ceil(0.75 n) voters must take part; the last voter's link goes down as soon as it has
    # received the pre-flight (its answer never arrives)
    result = federation.run("argmax-cut", cut=f"voter-{VOTERS - 1}", release="'argmax'",
                            **{"round-timeout": round(federation.cut_timeout(), 1)})
    assert result["privacy"]["survivors"] == VOTERS - 1
    assert result["privacy"]["released"].startswith(f"winning index only (secure argmax among {TALLIES} tallies")
    _federation_line(result)
    assert federation.link.poll() is None  # the SuperLink still serves
