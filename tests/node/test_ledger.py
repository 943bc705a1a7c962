"""The node's privacy ledger: recorded before sending, composed in RDP, refusing beyond the lifetime budget,
atomic, locked across processes, failing closed when corrupt; and the `dphype ledger` command."""

import fcntl
import hashlib
import json
import multiprocessing
import os

import pytest
from helpers import make_request

from dphype.cli import main
from dphype.node import ledger as ledger_module
from dphype.node.ledger import FORMAT, VERSION, Ledger, LedgerError
from dphype.node.policy import NodePolicy, check_vote_request
from dphype.privacy.accounting import RDP_ORDERS, rdp_epsilon, vote_rdp
from dphype.privacy.winner import epsilon_with_samplers, winner_rdp
from dphype.refusal import Refusal


@pytest.fixture
def policy(tmp_path):
    return NodePolicy(ledger=tmp_path / "node" / "ledger.json", lifetime_epsilon=4.0)


def vote(policy, **kwargs):
    return check_vote_request(make_request(**kwargs), policy)


def test_spend_records_the_vote_durably_with_its_worst_case_release(policy):
    ledger = Ledger(policy.ledger)
    assert ledger.entries() == [] and ledger.spent(1e-5) == 0.0
    guarantee = vote(policy, dropout=0.1)
    total = ledger.spend(guarantee, policy, "digest-1")
    assert total == pytest.approx(guarantee.epsilon, rel=1e-9)  # one Skellam vote: the grid holds its order
    (entry,) = Ledger(policy.ledger).entries()  # a fresh reader sees it
    assert (entry.request, entry.noise, entry.k, entry.survivors) == ("digest-1", "skellam", 5, 45)
    assert entry.total_std == guarantee.total_std and entry.delta == 1e-5
    data = json.loads(policy.ledger.read_text())
    assert data["format"] == FORMAT and data["version"] == VERSION and len(data["entries"]) == 1
    assert oct(policy.ledger.parent.stat().st_mode & 0o777) == "0o700"


def test_votes_compose_in_rdp(policy):
    ledger = Ledger(policy.ledger)
    gaussian, skellam = vote(policy, noise="gaussian"), vote(policy, noise="skellam", epsilon=0.5)
    ledger.spend(gaussian, policy, "a")
    total = ledger.spend(skellam, policy, "b")
    expected = rdp_epsilon(vote_rdp(5, gaussian.total_std, "gaussian") + vote_rdp(5, skellam.total_std, "skellam"),
                           1e-5)[0]
    assert total == pytest.approx(expected, rel=1e-12) == pytest.approx(ledger.spent(1e-5), rel=1e-12)
    assert max(gaussian.epsilon, skellam.epsilon) < total < gaussian.epsilon + skellam.epsilon


def test_300_repeated_requests_are_refused_once_the_lifetime_budget_is_spent(policy):
    ledger = Ledger(policy.ledger)
    request = make_request()
    accepted = refused = 0
    for _ in range(300):
        try:
            guarantee = check_vote_request(request, policy)  # the same request every time
            ledger.check(guarantee, policy)  # pre-flight
            ledger.spend(guarantee, policy, "same-request")  # before the masked vector is sent
            accepted += 1
        except Refusal as refusal:
            assert refusal.code == "lifetime_budget" and "budget" in refusal.detail
            refused += 1
    assert refused == 300 - accepted > 0  # the budget ran out: every later repeat was refused
    entries = ledger.entries()
    assert len(entries) == accepted and all(e.request == "same-request" for e in entries)  # repeats cost again
    spent = ledger.spent(1e-5)
    assert spent <= policy.lifetime_epsilon
    one = rdp_epsilon(vote_rdp(5, entries[0].total_std, "skellam"), 1e-5)[0]
    assert one == pytest.approx(1.0, rel=1e-6)
    # one more vote would exceed the budget: the budget is used up to its last vote
    assert rdp_epsilon((accepted + 1) * vote_rdp(5, entries[0].total_std, "skellam"), 1e-5)[0] > policy.lifetime_epsilon
    assert 5 <= accepted <= 20


def test_a_ledger_written_before_reads_its_votes_by_their_noise_names(tmp_path):
    """The file format's names are the wire's: a ledger with a Skellam vote and a winner vote (no ``release``
    field, as older ledgers wrote them) still reads, and each vote composes by its kind."""
    winner = {"time": "2026-01-01T12:00:00+00:00", "request": "a" * 64, "noise": "discrete-laplace", "k": 1,
              "total_std": 2.27, "survivors": 5, "epsilon": 1.0, "delta": 1e-05, "neighbouring": "add-remove"}
    entries = [{**winner, "noise": "skellam", "k": 5, "total_std": 12.84, "epsilon": 0.9993,
                "neighbouring": "replace-one", "release": "vote"}, winner]
    digest = hashlib.sha256(json.dumps(entries, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    path = tmp_path / "ledger.json"
    path.write_text(json.dumps({"format": "dphype-ledger", "version": 1, "entries": entries, "checksum": digest}))
    read = Ledger(path).entries()
    assert [e.noise for e in read] == ["skellam", "discrete-laplace"]
    curve = vote_rdp(5, 12.84, "skellam") + winner_rdp(2.0, RDP_ORDERS)  # add-remove's epsilon 1: 2 replace-one
    assert Ledger(path).spent(1e-5) == epsilon_with_samplers(curve, 1e-5, 1)


def test_check_does_not_record(policy):
    ledger = Ledger(policy.ledger)
    assert ledger.check(vote(policy), policy) == pytest.approx(1.0, rel=1e-6)
    assert ledger.entries() == [] and not policy.ledger.exists()


def test_a_failed_write_leaves_the_previous_ledger_intact(policy, monkeypatch):
    ledger = Ledger(policy.ledger)
    ledger.spend(vote(policy), policy, "first")
    before = policy.ledger.read_bytes()

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(ledger_module.os, "replace", crash)
    with pytest.raises(LedgerError, match="cannot be written"):
        ledger.spend(vote(policy), policy, "second")
    monkeypatch.undo()
    assert policy.ledger.read_bytes() == before
    assert sorted(p.name for p in policy.ledger.parent.iterdir()) == ["ledger.json", "ledger.json.lock"]


@pytest.mark.parametrize(
    "mutate,why",
    [
        (lambda d: "{not json", "not JSON"),
        (lambda d: json.dumps({**d, "format": "other"}), "another format"),
        (lambda d: json.dumps({**d, "version": 2}), "a newer version"),
        (lambda d: json.dumps({**d, "entries": d["entries"][:-1]}), "a deleted entry (checksum)"),
        (lambda d: json.dumps({**d, "entries": [{**d["entries"][0], "total_std": 1e6}]}), "an edited entry"),
        (lambda d: json.dumps({**d, "extra": 1}), "an unknown field"),
        (lambda d: json.dumps(d)[:-5], "a truncated file"),
    ],
)
def test_a_corrupt_ledger_refuses_every_vote(policy, mutate, why):
    ledger = Ledger(policy.ledger)
    ledger.spend(vote(policy), policy, "a")
    ledger.spend(vote(policy), policy, "b")
    policy.ledger.write_text(mutate(json.loads(policy.ledger.read_text())))
    for call in (ledger.entries, lambda: ledger.check(vote(policy), policy),
                 lambda: ledger.spend(vote(policy), policy, "c")):
        with pytest.raises(LedgerError, match="corrupt"):
            call()


def test_a_held_lock_times_out_and_refuses(policy, monkeypatch):
    ledger = Ledger(policy.ledger)
    ledger.spend(vote(policy), policy, "a")
    monkeypatch.setattr(ledger_module, "LOCK_TIMEOUT", 0.2)
    fd = os.open(f"{policy.ledger}.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another ClientApp process holds the ledger
        with pytest.raises(LedgerError, match="locked"):
            ledger.spend(vote(policy), policy, "b")
    finally:
        os.close(fd)
    assert len(ledger.entries()) == 1


def _spend_many(path, attempts, results):
    policy = NodePolicy(ledger=path, lifetime_epsilon=4.0)
    guarantee = check_vote_request(make_request(), policy)
    accepted = 0
    for _ in range(attempts):
        try:
            Ledger(path).spend(guarantee, policy, str(os.getpid()))
            accepted += 1
        except Refusal:
            pass
    results.put(accepted)


def test_concurrent_processes_never_overspend_or_corrupt(policy):
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    workers = [ctx.Process(target=_spend_many, args=(policy.ledger, 8, results)) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    accepted = sum(results.get(timeout=5) for _ in workers)
    entries = Ledger(policy.ledger).entries()
    assert len(entries) == accepted and len({e.request for e in entries}) > 1  # several processes wrote
    assert Ledger(policy.ledger).spent(1e-5) <= 4.0
    single = Ledger(policy.ledger.parent / "single.json")
    g = vote(policy)
    sequential = 0
    while True:
        try:
            single.spend(g, policy, "s")
            sequential += 1
        except Refusal:
            break
    assert accepted == sequential  # the same number as one process spending alone


def test_cli_shows_the_ledger(policy, capsys):
    Ledger(policy.ledger).spend(vote(policy), policy, "abc")
    Ledger(policy.ledger).spend(vote(policy), policy, "abc")
    assert main(["ledger", "--path", str(policy.ledger), "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["votes"] == 2 and out["exists"] and out["path"] == str(policy.ledger)
    assert out["epsilon"] == pytest.approx(Ledger(policy.ledger).spent(1e-5))
    assert [e["request"] for e in out["entries"]] == ["abc", "abc"]
    assert main(["ledger", "--path", str(policy.ledger)]) == 0
    assert "votes: 2" in capsys.readouterr().out


def test_cli_without_a_ledger_and_with_a_corrupt_one(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    assert main(["ledger", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["votes"] == 0 and not out["exists"] and out["path"] == str(tmp_path / "dphype" / "ledger.json")
    (tmp_path / "dphype").mkdir()
    (tmp_path / "dphype" / "ledger.json").write_text("garbage")
    assert main(["ledger"]) == 2
    assert "corrupt" in capsys.readouterr().err


@pytest.mark.parametrize(("noise", "votes"), [("skellam", 1), ("gaussian", 3)])
def test_admitting_policy_admits_exactly_its_votes(tmp_path, noise, votes):
    from dphype.node.ledger import admitting_policy

    request = make_request(noise=noise, clients=8, dropout=0.25)
    keys = admitting_policy(request, votes=votes)
    assert keys["dphype-min-clients"] == 6 and keys["dphype-max-epsilon"] == 1.0  # ceil(0.75 * 8) contributors
    policy = NodePolicy.from_node_config({**keys, "dphype-ledger": str(tmp_path / "ledger.json")})
    ledger = Ledger(policy.ledger)
    for i in range(votes):
        ledger.spend(check_vote_request(request, policy), policy, f"vote {i}")
    with pytest.raises(Refusal, match="lifetime_budget"):
        ledger.check(check_vote_request(request, policy), policy)
    with pytest.raises(Refusal, match="policy_epsilon"):  # nothing more generous than the request itself
        check_vote_request(make_request(noise=noise, clients=8, dropout=0.25, epsilon=1.1), policy)


# ----------------------------------------------------- per-run ledgers in simulation, list and archive
ONE_VOTE = {"dphype-max-epsilon": 1.0, "dphype-min-clients": 2, "dphype-min-neighbours": 1,
            "dphype-lifetime-epsilon": 1.2}  # admits one vote at epsilon 1, not two


def select_once(run_id: int, ledgers: dict[int, str] | None = None):
    """One selection of 4 simulated nodes (each admits one vote in its lifetime) in run ``run_id``."""
    import numpy as np
    from helpers import CANDS, client_app

    from dphype.config import DPHypeConfig
    from dphype.flower import DPHype
    from dphype.flower.local import LocalGrid

    grid = LocalGrid(client_app(np.random.default_rng(0).uniform(size=(4, 8))), 4, node_config=ONE_VOTE,
                     run_id=run_id)
    for i, path in (ledgers or {}).items():
        grid.contexts[list(grid.contexts)[i]].node_config["dphype-ledger"] = path
    return DPHype(CANDS, DPHypeConfig(epsilon=1.0, delta=1e-5, k=2, clients=4)).start(grid)


def test_a_simulation_run_twice_keeps_its_budget_but_a_named_ledger_is_spent(monkeypatch, tmp_path, caplog):
    import logging

    import dphype.flower.client.policy_client as client_policy
    from dphype.flower import PreflightError

    monkeypatch.setattr(client_policy, "simulated", lambda: True)  # as in a Ray worker of Flower's simulation
    with caplog.at_level(logging.INFO, logger="flwr"):
        first, second = select_once(run_id=11), select_once(run_id=12)
    assert first.notes == second.notes == ("4 of 4 nodes are simulated with a per-run ledger: their lifetime "
                                           "budget restarts with every run (an operator who names dphype-ledger "
                                           "keeps one across runs)",)
    assert "note: 4 of 4 nodes are simulated with a per-run ledger" in second.summary()
    assert "simulated node: a per-run ledger" in caplog.text and "is NOT seen" in caplog.text
    named = {i: str(tmp_path / f"node-{i}.json") for i in range(4)}
    third = select_once(run_id=13, ledgers=named)
    assert third.notes == ()
    with pytest.raises(PreflightError, match="4 x refused: policy"):  # lifetime_budget, in the nodes' own logs
        select_once(run_id=14, ledgers=named)  # the operator's own ledgers keep counting across runs


def test_cli_lists_ledgers_and_archives_a_named_one_with_a_warning(policy, capsys, private_flwr_home):
    run_ledger = private_flwr_home / "dphype" / "runs" / "run-7" / "ledger-partition-0.json"
    moved = private_flwr_home / "dphype" / "ledger.json"  # the node's persistent ledger
    for path in (run_ledger, moved):
        Ledger(path).spend(vote(policy), policy, "r")
    assert main(["ledger", "--list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [row["path"] for row in listed["ledgers"]] == [str(moved), str(run_ledger)]
    assert [row["votes"] for row in listed["ledgers"]] == [1, 1]
    assert main(["ledger", "--archive"]) == 2
    assert "--archive needs --path FILE" in capsys.readouterr().err
    assert main(["ledger", "--archive", "--path", str(moved)]) == 0
    out = capsys.readouterr()
    assert "warning: archiving a ledger is the node operator's decision" in out.err
    assert not moved.exists() and len(list(moved.parent.glob("ledger.archived-*.json"))) == 1
    assert Ledger(moved).entries() == [] and Ledger(moved).check(vote(policy), policy) > 0  # a new, empty ledger
    assert main(["ledger", "--archive", "--path", str(moved)]) == 2
    assert "does not exist; nothing to archive" in capsys.readouterr().err
