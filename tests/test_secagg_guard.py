"""SecAgg+ checks on the client: every view an honest Flower 1.41 workflow gives passes, the attacks of
issue 8 (threshold 1, no neighbours, overlapping lists, an over-claimed n) are refused."""

import random

import pytest

from dphype.checks import MAX_CLIENTS
from dphype.privacy.noise import min_survivors
from dphype.protocol import Refusal
from dphype.secure.guard import (
    SecAggSetup,
    check_neighbours,
    check_setup,
    check_share_sources,
    check_unmask,
    dphype_encoding,
)
from dphype.secure.secagg_params import secure_parameters


def setup(sample_num=50, share_num=11, threshold=7, **encoding):
    encoding = {**dphype_encoding(min(sample_num, MAX_CLIENTS)), **encoding}
    return SecAggSetup(sample_num, share_num, threshold, **encoding)


def keys(ids):
    return {i: (b"pk1-%d" % i, b"pk2-%d" % i) for i in ids}


def code(call):
    with pytest.raises(Refusal) as info:
        call()
    return info.value.code


def flower_setup(n, num_shares, reconstruction_threshold=0.6):
    """share_num and threshold as Flower 1.41's SecAggPlusWorkflow.setup_stage derives them from fractions."""
    s = round(num_shares * n)
    if s < n and s % 2 == 0:
        s += 1
    if s <= 2:
        s = n
    return setup(n, s, max(round(reconstruction_threshold * s), 2))


def secure_setup(n, dropout=0.0):
    """share_num and threshold of the secure graph DP-Hype's workflow uses (dphype.flower.secagg.secagg_graph:
    secure_parameters with the clients' majority rule)."""
    params = secure_parameters(n, dropout=dropout, majority=True)
    return setup(n, params.num_shares, params.threshold)


def honest_views(n, dropout, drops, seed):
    """What every surviving client sees in an honest run of DP-Hype's workflow (Flower's ring graph on
    shuffled ids; ExactSumWorkflow forgets clients lost in stages 0-1), with ``drops[stage]`` clients lost
    in stage 0, 1 and 2. Yields (client, setup, stage-1 keys, stage-2 sources, active, dead)."""
    sa = secure_setup(n, dropout)
    rng = random.Random(seed)
    ids = rng.sample(range(10_000, 99_999), n)
    half = sa.share_num >> 1
    neighbours = {v: {ids[(i + o) % n] for o in range(-half, half + 1)} for i, v in enumerate(ids)}
    alive = [set(ids)]
    for lost in drops:
        alive.append(alive[-1] - set(rng.sample(sorted(alive[-1]), lost)))
    a0, a1, a2 = alive[1], alive[2], alive[3]
    assert len(a2) >= min_survivors(n, dropout)  # else the server would not unmask
    for v in sorted(a2):
        holders = neighbours[v] & a0
        sources = sorted((neighbours[v] & a1) - {v})  # the ring is symmetric: they listed v and sent it shares
        yield v, sa, keys(holders), sources, sorted(neighbours[v] & a2), sorted(neighbours[v] & (a1 - a2))


# ------------------------------------------------------------------------------------- honest runs
@pytest.mark.parametrize("n,dropout,drops", [(10, 0.0, (0, 0, 0)), (10, 0.2, (1, 0, 1)), (50, 0.1, (2, 1, 2)),
                                             (50, 0.0, (0, 0, 0)), (250, 0.05, (4, 4, 4)), (1000, 0.02, (5, 5, 10))])
def test_every_view_of_an_honest_run_passes(n, dropout, drops):
    views = 0
    for v, sa, pks, sources, active, dead in honest_views(n, dropout, drops, seed=n):
        check_setup(sa, clients=n)
        check_neighbours(sa, v, pks, clients=n, dropout=dropout, min_neighbours=4)
        check_share_sources(v, sources, pks, threshold=sa.threshold)
        check_unmask(v, active, dead, [v, *sources], threshold=sa.threshold, clients=n, dropout=dropout)
        views += 1
    assert views == n - sum(drops)


@pytest.mark.parametrize("n", [5, 7, 10, 20, 35, 50, 100, 250, 500, 1023])
@pytest.mark.parametrize("dropout", [0.0, 0.2, 0.3])
def test_dphype_default_secagg_parameters_pass_the_threshold_rule(n, dropout):
    # without the majority rule the secure graph has 2 t <= s at (5, 0.2), (10, 0.3), (20, 0.3), ...:
    # an honest DP-Hype server would propose a graph its own clients refuse
    sa = secure_setup(n, dropout)
    check_setup(sa, clients=n, dropout=dropout)
    assert 2 * sa.threshold > sa.share_num


def test_threshold_fraction_0_6_fails_at_four_clients():
    # round(0.6 * 4) = 2 shares of 4: two holders on each side of a lie give the server both secrets
    assert code(lambda: check_setup(flower_setup(4, 1.0), clients=4)) == "secagg_setup"


# ------------------------------------------------------------------------------------------ attacks
def test_issue_8_fake_round_threshold_1_and_no_neighbours_is_refused():
    # stage 0 of the reproduced attack: threshold 1
    assert code(lambda: check_setup(setup(threshold=1))) == "secagg_setup"
    # a single share holder (the client itself): threshold 1 is then "more than half"; still refused
    assert code(lambda: check_setup(setup(share_num=1, threshold=1))) == "secagg_setup"
    # stage 1 with no neighbours but the client itself
    honest_setup = setup()
    assert code(lambda: check_neighbours(honest_setup, 7, keys([7]), clients=50, dropout=0.0,
                                         min_neighbours=4)) == "secagg_neighbours"


@pytest.mark.parametrize("s,t", [(11, 5), (11, 1), (10, 5), (3, 1), (2, 1), (11, 12), (2, 2)])
def test_thresholds_that_let_a_server_collect_both_shares_are_refused(s, t):
    # (2, 2): fewer than 3 holders (dphype.secure.secagg_params.check_share_threshold, the one home of the rule)
    assert code(lambda: check_setup(setup(share_num=s, threshold=t))) == "secagg_setup"


@pytest.mark.parametrize("s,t", [(11, 6), (11, 11), (3, 3), (3, 2)])
def test_thresholds_above_half_pass(s, t):
    check_setup(setup(share_num=s, threshold=t))


@pytest.mark.parametrize("field,value", [("clipping_range", 8.0), ("target_range", 2**16), ("mod_range", 2**31),
                                         ("max_weight", 1000.0)])
def test_an_encoding_other_than_the_exact_sum_is_refused(field, value):
    assert code(lambda: check_setup(setup(**{field: value}))) == "secagg_setup"


def test_sample_count_must_match_the_announced_clients_and_fit_the_modulus():
    assert code(lambda: check_setup(setup(sample_num=5, share_num=5, threshold=3), clients=1023)) == "secagg_setup"
    assert code(lambda: check_setup(setup(sample_num=10_001, share_num=11, threshold=7))) == "secagg_setup"
    assert code(lambda: check_setup(setup(sample_num=5, share_num=7, threshold=4))) == "secagg_setup"


def test_issue_8_overclaimed_clients_against_the_neighbour_count():
    n_claimed, real = 1023, [11, 12, 13, 14, 15]
    # the server claims 1023 clients in stage 0 as Flower would, but only 5 keys exist
    claimed = secure_setup(n_claimed)
    check_setup(claimed, clients=n_claimed)
    assert code(lambda: check_neighbours(claimed, 11, keys(real), clients=n_claimed, dropout=0.0,
                                         min_neighbours=4)) == "secagg_neighbours"
    # also with a complete graph claimed, or with dropout tolerance
    complete = setup(n_claimed, n_claimed, 700)
    assert code(lambda: check_neighbours(complete, 11, keys(real), clients=n_claimed, dropout=0.1,
                                         min_neighbours=4)) == "secagg_neighbours"
    # what a client cannot see: a sparse graph of exactly the claimed size is consistent with any n
    sparse = setup(n_claimed, 5, 3)
    check_neighbours(sparse, 11, keys(real), clients=n_claimed, dropout=0.0, min_neighbours=4)


def test_neighbour_keys_must_be_distinct_present_and_enough():
    sa = setup()
    ids = list(range(1, 12))
    check_neighbours(sa, 1, keys(ids), clients=50, dropout=0.0, min_neighbours=4)
    repeated = keys(ids) | {5: (b"pk1-4", b"pk2-5")}
    cases = [
        (repeated, "repeated key"),
        (keys(ids[1:]), "own keys missing"),
        (keys(range(1, 13)), "more holders than share_num"),
        (keys(range(1, 6)), "fewer holders than n and xi allow"),
    ]
    for pks, _ in cases:
        assert code(lambda pks=pks: check_neighbours(sa, 1, pks, clients=50, dropout=0.0, min_neighbours=4)) \
            == "secagg_neighbours"
    # the same 5 holders are fine when the node asks for fewer neighbours and enough dropout is tolerated
    check_neighbours(setup(share_num=11, threshold=5), 1, keys(range(1, 6)), clients=50, dropout=0.2,
                     min_neighbours=4)
    assert code(lambda: check_neighbours(setup(share_num=11, threshold=5), 1, keys(range(1, 6)), clients=50,
                                         dropout=0.2, min_neighbours=5)) == "secagg_neighbours"
    assert code(lambda: check_neighbours(sa, 1, keys(ids), clients=51, dropout=0.0, min_neighbours=4)) \
        == "secagg_neighbours"


def test_share_sources_must_be_distinct_other_neighbours():
    neighbours = range(1, 12)
    check_share_sources(1, [2, 3, 4, 5, 6, 7], neighbours, threshold=7)
    for sources in ([2, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6], [2, 3, 4, 5, 6, 99], [2, 3, 4, 5, 6][:4]):
        assert code(lambda s=sources: check_share_sources(1, s, neighbours, threshold=7)) == "secagg_neighbours"


def test_issue_8_overlapping_active_and_dead_lists_are_refused():
    owners = list(range(1, 12))
    kw = {"threshold": 7, "clients": 50, "dropout": 0.1}
    check_unmask(1, owners[:9], owners[9:], owners, **kw)
    # the same node active and dead: the server would get both kinds of its shares from this client
    assert code(lambda: check_unmask(1, owners[:9], owners[8:], owners, **kw)) == "secagg_unmask"
    assert code(lambda: check_unmask(1, owners, owners, owners, **kw)) == "secagg_unmask"


@pytest.mark.parametrize(
    "active,dead,why",
    [
        ([1, 2, 3, 4, 5, 6, 7, 7], [], "repeated id"),
        ([1, 2, 3, 4, 5, 6, 7], [99], "a node this client holds no share of"),
        ([1, 2, 3, 4, 5, 6, 99], [], "a node this client holds no share of"),
        ([2, 3, 4, 5, 6, 7, 8], [1], "this client called dead"),
        ([1, 2, 3, 4, 5, 6], [7, 8, 9], "fewer active than the threshold"),
    ],
)
def test_unsafe_unmask_lists_are_refused(active, dead, why):
    assert code(lambda: check_unmask(1, active, dead, range(1, 12), threshold=7, clients=50, dropout=0.2)) \
        == "secagg_unmask", why


def test_without_dropout_tolerance_no_share_of_a_mask_key_is_revealed():
    # xi = 0: every client must survive, so a complete graph's lists must call everyone active
    owners = list(range(1, 11))
    check_unmask(1, owners, [], owners, threshold=6, clients=10, dropout=0.0)
    assert code(lambda: check_unmask(1, owners[:-1], owners[-1:], owners, threshold=6, clients=10,
                                     dropout=0.0)) == "secagg_unmask"
    needed = min_survivors(10, 0.3) - (10 - len(owners))
    assert needed == 7
    check_unmask(1, owners[:7], owners[7:], owners, threshold=6, clients=10, dropout=0.3)


def test_setup_from_a_stage_0_config_record():
    config = {"sample_num": 50, "share_num": 11, "threshold": 7, **dphype_encoding(50), "stage": "setup"}
    assert SecAggSetup.from_config(config) == setup()
    for bad in ({**config, "threshold": True}, {k: v for k, v in config.items() if k != "max_weight"},
                {**config, "share_num": "11"}):
        assert code(lambda bad=bad: SecAggSetup.from_config(bad)) == "secagg_setup"


# ------------------------------------------------------------------- what local checks cannot stop
def isolation_attack(n=50, s=11, t=7):
    """An active server's views that unmask client 0 alone in a sparse graph (threat model, dphype.node.policy).

    Client 0's holders are X = 1..10; each x in X gets holders {x, 0} and 9 clients of Z (the other 39),
    which hold x's mask key and are told x dropped; Z is a ring (+-3) so that every z has 7 active.
    Returns per client: (holders, active, dead)."""
    u, xs, zs = 0, list(range(1, s)), list(range(s, n))
    serve = {x: {zs[(9 * i + j) % len(zs)] for j in range(9)} for i, x in enumerate(xs)}
    holders = {u: {u, *xs}}
    for x in xs:
        holders[x] = {x, u, *serve[x]}
    for i, z in enumerate(zs):
        ring = {zs[(i + o) % len(zs)] for o in range(-3, 4)}
        holders[z] = ring | {x for x in xs if z in serve[x]}
    views = {u: (holders[u], [u, *xs[:6]], xs[6:])}
    views.update({x: (holders[x], sorted(holders[x]), []) for x in xs})
    views.update({z: (holders[z], sorted(holders[z] - set(xs)), sorted(holders[z] & set(xs))) for z in zs})
    return setup(n, s, t), views


def test_sparse_graph_isolation_passes_every_local_check_unless_xi_is_0():
    sa, views = isolation_attack()
    for v, (holders, active, dead) in views.items():
        check_setup(sa, clients=50)
        check_neighbours(sa, v, keys(holders), clients=50, dropout=0.1, min_neighbours=4)
        check_share_sources(v, sorted(holders - {v}), holders, threshold=sa.threshold)
        check_unmask(v, active, dead, holders, threshold=sa.threshold, clients=50, dropout=0.1)
    # yet the server collects b_0 from >= t holders and the mask key of every neighbour of client 0:
    # it removes all masks from client 0's vector, which carries a single noise share
    b_shares = sum(0 in active for _, active, _ in views.values())
    key_shares = {x: sum(x in dead for _, _, dead in views.values()) for x in range(1, 11)}
    assert b_shares >= sa.threshold and min(key_shares.values()) >= sa.threshold
    # with xi = 0 no client may call a neighbour dead, so the same views are refused
    refusals = 0
    for v, (holders, active, dead) in views.items():
        try:
            check_neighbours(sa, v, keys(holders), clients=50, dropout=0.0, min_neighbours=4)
            check_unmask(v, active, dead, holders, threshold=sa.threshold, clients=50, dropout=0.0)
        except Refusal:
            refusals += 1
    assert refusals == 1 + 39  # client 0 and every z (each held a dead list or too few neighbours)


def test_the_round_runs_over_the_clients_ready_after_the_preflight():
    # n = 50 announced with xi = 0.1: a round over 45..50 ready clients, each with its own exact-sum range
    for m in (45, 48, 50):
        check_setup(setup(sample_num=m), clients=50, dropout=0.1)
    for m in (44, 51):  # fewer than a release needs, or more than announced
        assert code(lambda m=m: check_setup(setup(sample_num=m), clients=50, dropout=0.1)) == "secagg_setup"
    # stage 1: at 45 of 45 needed no holder may be missing; at 50 up to 5 may
    check_neighbours(setup(sample_num=45), 1, keys(range(1, 12)), clients=50, dropout=0.1, min_neighbours=4)
    assert code(lambda: check_neighbours(setup(sample_num=45), 1, keys(range(1, 11)), clients=50, dropout=0.1,
                                         min_neighbours=4)) == "secagg_neighbours"
    check_neighbours(setup(sample_num=50), 1, keys(range(1, 8)), clients=50, dropout=0.1, min_neighbours=4)
    assert code(lambda: check_neighbours(setup(sample_num=44), 1, keys(range(1, 12)), clients=50, dropout=0.1,
                                         min_neighbours=4)) == "secagg_neighbours"
    # stage 3: the survivors outside this node's 11 holders are at most m - 11
    owners = list(range(1, 12))
    check_unmask(1, owners, [], owners, threshold=7, clients=50, dropout=0.1, sample_num=45)
    assert code(lambda: check_unmask(1, owners[:10], owners[10:], owners, threshold=7, clients=50, dropout=0.1,
                                     sample_num=45)) == "secagg_unmask"
    check_unmask(1, owners[:10], owners[10:], owners, threshold=7, clients=50, dropout=0.1, sample_num=50)
