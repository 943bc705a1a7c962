"""The node's privacy ledger: recorded before sending, composed in RDP, refusing beyond the lifetime budget,
atomic, locked across processes, failing closed when corrupt; and the `dphype ledger` command."""

import fcntl
import json
import multiprocessing
import os

import pytest
from guard_helpers import make_request

from dphype.cli import main
from dphype.node import ledger as ledger_module
from dphype.node.ledger import FORMAT, VERSION, Ledger, LedgerError
from dphype.node.policy import NodePolicy, check_vote_request
from dphype.privacy.accounting import rdp_epsilon, vote_rdp
from dphype.protocol import Refusal


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


def test_issue_8_300_repeated_requests_are_refused_once_the_lifetime_budget_is_spent(policy):
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
