"""The bundled app in argmax mode, in process: its ServerApp logic with voters and 3 simulated tally nodes."""

from __future__ import annotations

import pytest
from helpers import PERMISSIVE, a_run_folder

from dphype.app.run_config import AppConfig
from dphype.config import DPHypeConfig
from dphype.flower import PreflightError, load_tally_key
from dphype.flower.client.roles import simulated_parties
from dphype.flower.local import LocalGrid, node_id
from dphype.flower.wire import TALLY_KEY
from dphype.ml.reference import majority_of_test_split
from dphype.node.policy import run_ledger_path
from dphype.privacy.winner import WINNER_NOISE
from dphype.secure.committee import TallyError
from dphype.selection.candidates import load_candidates

CLIENTS = 4
SUBSET = "table3:random:10:0"


def app_grid(nodes: int, **kwargs) -> tuple[AppConfig, LocalGrid]:
    """The bundled apps on ``nodes`` simulated nodes with the run config ``flwr run`` would give them."""
    import dphype.app.client_app as client_app

    cfg = AppConfig(DPHypeConfig(epsilon=4.0, delta=1e-5, k=3, clients=CLIENTS, release="argmax"),
                    candidates=SUBSET, fedavg_rounds=1, local_epochs=1, **kwargs)
    run_config = {"dataset": "adult", "seed": 0, "local-epochs": 1, "release": "argmax", "clients": CLIENTS,
                  "tallies": cfg.tallies}
    # the operator of this in-process federation pins the committee it runs: the keys the tally nodes will load
    # from the run's folder (a Ray simulation's voters pin it themselves: `dphype demo` in
    # tests/deployment/test_packaging.py)
    folder = run_ledger_path(1).parent
    pins = ",".join(load_tally_key(folder / f"tally-{j}.key").public.hex() for j in range(cfg.tallies))
    # the simulated_roles mod gives every node its role and the run's simulated federation, as in a Ray worker
    # (`ray_worker`), so the grid makes no roster of its own
    return cfg, LocalGrid(client_app.app, nodes, run_config=run_config,
                          node_config={**PERMISSIVE, "dphype-tallies": pins}, federation=False)


@pytest.fixture
def ray_worker(monkeypatch):
    """The simulated_roles mod acts as in a Ray worker of Flower's simulation (roles and federation)."""
    import dphype.flower.client.roles as roles

    monkeypatch.setattr(roles, "simulated", lambda: True)


def test_bundled_app_in_argmax_mode_selects_with_simulated_tallies_and_trains_on_the_voters_only(ray_worker):
    from dphype.app.server_app import run_app

    cfg, grid = app_grid(CLIENTS + 3, round_timeout=120.0)
    summary = run_app(grid, cfg, a_run_folder())
    voters, tallies = [node_id(i) for i in range(CLIENTS)], [node_id(CLIENTS + j) for j in range(3)]
    # only the index left the committee: no vote vector, pure epsilon with the winner's noise
    assert summary["noisy_sum"] is None and summary["selected_index"] in range(10)
    privacy = summary["privacy"]
    assert (privacy["noise"], privacy["epsilon"], privacy["survivors"]) == (WINNER_NOISE, 4.0, CLIENTS)
    # partitions CLIENTS.. became tallies 0..2 with the run's shared MPyC addresses; the voters kept the sum
    # mode's data split (CLIENTS shards, not CLIENTS + 3)
    for j, node in enumerate(tallies):
        config = grid.contexts[node].node_config
        assert config["dphype-tally-id"] == j
        assert config["dphype-tally-parties"] == ",".join(simulated_parties(1, 3))
    assert all(grid.contexts[n].node_config["num-partitions"] == CLIENTS for n in voters)
    by_type: dict[str, set[int]] = {}
    for m in grid.sent:
        by_type.setdefault(m.metadata.message_type, set()).add(m.metadata.dst_node_id)
    assert by_type["train.dphype_committee"] == set(voters) and "train.dphype" not in by_type
    assert by_type["train"] == set(voters) and by_type["evaluate"] == set(voters)  # FedAvg: never a tally
    assert by_type["query.dphype_tally"] == set(voters) | set(tallies)  # hello to all, the stages to tallies
    hellos = [m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == "query.dphype_tally"
              and m.content.config_records[TALLY_KEY].get("stage") == "hello"]
    assert sorted(hellos) == sorted(voters + tallies)  # one hello round: DPHype.start does not ask again
    assert not [r for r in grid.replies if r.has_error()]
    assert summary["accuracy"] > majority_of_test_split("adult") + 0.03


def test_too_few_tally_nodes_connected_is_refused_before_any_client_works(ray_worker):
    from dphype.app.server_app import run_app

    cfg, grid = app_grid(CLIENTS + 2, connect_timeout=0.1)
    with pytest.raises(PreflightError, match=r"(?s)^only 6 of the 7 nodes connected within 0.1 s: start the tally "
                                             r"nodes\na committee release needs clients \+ tallies = 7 nodes "
                                             r"\(4 voters and 3 tally nodes\).*"
                                             r"`dphype run`.*num-supernodes=7.*simulated_roles.*start-tally.sh"):
        run_app(grid, cfg, a_run_folder())
    assert not grid.sent


def test_a_tally_that_does_not_answer_is_named_before_any_client_works(ray_worker):
    from dphype.app.server_app import run_app

    cfg, grid = app_grid(CLIENTS + 3, round_timeout=1.0)
    grid.silent = {node_id(CLIENTS + 1)}  # tally 1 never answers
    with pytest.raises(TallyError, match=r"tallies=3 needs tally nodes 0..2 to answer, got 2 \(0, 2\): start the "
                                         "missing tallies\nnothing was sent to the clients: in simulation give the "
                                         "ClientApp the mod "
                                         r"dphype.flower.simulated_roles .*`dphype run`; in a deployment .*"
                                         "start-tally.sh"):
        run_app(grid, cfg, a_run_folder())
    assert {m.metadata.message_type for m in grid.sent} == {"query.dphype_tally"}
    assert {dict(m.content.config_records[TALLY_KEY])["stage"] for m in grid.sent} == {"hello"}


def test_two_nodes_claiming_one_tally_index_are_refused(tmp_path, ray_worker):
    from dphype.app.server_app import run_app

    cfg, grid = app_grid(CLIENTS + 3, round_timeout=5.0)
    grid.contexts[node_id(CLIENTS + 2)].node_config.update(  # an operator's node config: tally 0 again
        {"dphype-tally-id": 0, "dphype-tally-parties": "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
         "dphype-tally-key": str(tmp_path / "second-0.key"), "dphype-allow-unauthenticated": True})
    with pytest.raises(TallyError, match="two nodes answer as tally 0; nothing was sent to the clients"):
        run_app(grid, cfg, a_run_folder())


def test_the_app_run_config_names_the_committee_size():
    with pytest.raises(ValueError, match="tallies must be an integer >= 3, got 2"):
        AppConfig(DPHypeConfig(epsilon=1.0, delta=1e-5, k=3, clients=4), tallies=2)
    given = {"epsilon": 1.0, "delta": 1e-5, "k": 3, "clients": 4}
    assert AppConfig.from_run_config(given).dphype.release == "argmax"  # the app's default, not the library's
    assert DPHypeConfig(**given).release == "sum"


def test_an_argmax_selection_without_tally_keys_names_the_remedy():
    """The error a user of their own ServerApp meets first: it says how to find the committee."""
    from dphype.flower import DPHype

    with pytest.raises(ValueError, match=r"release='argmax' needs the tally keys, got none: pass "
                                         r"DPHype\(candidates, config, tallies=committee.keys\)\nwith committee = "
                                         r"dphype.flower.connected_committee\(grid, config\).*simulated_roles.*"
                                         r"`dphype run`.*start-tally.sh"):
        DPHype(load_candidates("table3"),
               DPHypeConfig(epsilon=1.0, delta=1e-5, k=2, clients=10, release="argmax"))


def test_the_connected_committee_of_a_sum_release_is_none_and_its_voters_are_the_grid():
    from dphype.flower import ClientGrid, connected_committee

    grid = LocalGrid(None, 3)  # nothing is sent: sum mode has no committee, and no other node to tell apart
    committee = connected_committee(grid, DPHypeConfig(epsilon=1.0, delta=1e-5, k=2, clients=3), connect_timeout=0.1)
    assert (committee.keys, committee.nodes, committee.others) == ((), (), ()) and not grid.sent
    voters = committee.voters  # the grid itself, behind the wrapper that retries a transient SuperLink error
    assert isinstance(voters, ClientGrid) and voters.grid is grid and committee.selection_grid.grid is grid
    assert list(voters.get_node_ids()) == list(grid.get_node_ids())


def test_the_committee_search_refuses_a_k_its_candidates_cannot_serve_before_any_node_is_asked():
    from dphype.flower import connected_committee

    grid = LocalGrid(None, 0)  # no node: a wait would time out, a refusal comes first
    candidates = load_candidates("table3")
    config = DPHypeConfig(epsilon=1.0, delta=1e-5, k=len(candidates) + 1, clients=3, release="argmax",
                          ballot="top-k")
    p = len(candidates)
    with pytest.raises(ValueError, match=rf"k must be an integer in \[1, {p}\], got {p + 1}"):
        connected_committee(grid, config, candidates=candidates, connect_timeout=0.1)
    assert not grid.sent


def test_a_simulated_voter_pins_the_committee_its_operator_made_and_a_deployed_one_is_never_given_tallies(
        tmp_path, monkeypatch):
    """Safe tallies by default: a node seals shares only to tallies its operator pinned. In Flower's
    simulation the operator made the committee (its key files), so the bundled app's voters pin those keys in their
    node config (never from the run config: the server cannot name a tally); a deployed voter gets nothing, its
    operator's own dphype-tallies is kept, and without one it refuses the pre-flight naming the key to set."""
    from flwr.app import Context, RecordDict

    import dphype.flower.client.roles as roles
    from dphype.flower.client.roles import simulated_role
    from dphype.node.policy import NodePolicy, check_vote_request
    from dphype.protocol import make_vote_request
    from dphype.refusal import Refusal
    from dphype.selection.candidates import load_candidates

    def voter(**node_config):
        return Context(run_id=7, node_id=1, node_config={"partition-id": 0, "num-partitions": CLIENTS + 3,
                                                          **node_config}, state=RecordDict(), run_config={})

    keys = tuple(load_tally_key(tmp_path / f"tally-{j}.key").public for j in range(3))
    deployed = voter()
    simulated_role(deployed, CLIENTS, 3, tmp_path)
    assert "dphype-tallies" not in deployed.node_config
    request = make_vote_request(DPHypeConfig(epsilon=4.0, delta=1e-5, k=3, clients=CLIENTS, release="argmax"),
                                load_candidates(SUBSET), tallies=keys)
    with pytest.raises(Refusal, match="tally_committee: this node's operator pinned no tallies.*dphype-tallies"):
        check_vote_request(request, NodePolicy.from_node_config({**PERMISSIVE, **deployed.node_config}))
    monkeypatch.setattr(roles, "simulated", lambda: True)
    simulation = voter()
    simulated_role(simulation, CLIENTS, 3, tmp_path)
    assert simulation.node_config["dphype-tallies"] == ",".join(k.hex() for k in keys)
    assert check_vote_request(request, NodePolicy.from_node_config({**PERMISSIVE, **simulation.node_config}))
    own = voter(**{"dphype-tallies": keys[0].hex()})  # the operator's own pin wins
    simulated_role(own, CLIENTS, 3, tmp_path)
    assert own.node_config["dphype-tallies"] == keys[0].hex()


def test_private_training_waits_for_every_sampled_node_plaintext_training_for_the_selections_floor():
    """DP-FedAvg's accounting assumes every sampled node contributes: it must not go on with the selection's floor
    (Flower refuses later with its own error); plaintext FedAvg may."""
    from dphype.app.server_app import training_floor
    from dphype.flower import TrainingBudget

    assert training_floor(8, TrainingBudget(epsilon=1.0, rounds=2), sampled=10) == 10
    assert training_floor(8, None, sampled=10) == 8
