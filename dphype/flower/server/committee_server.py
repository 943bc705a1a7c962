"""The server's side of the argmax mode (``release="argmax"``): the tally committee, the sealed shares, the index.

`run_committee_selection` (called by `dphype.flower.server.DPHype.start`) finds the configured committee among the
connected nodes (a tally that does not answer ``hello`` is unreachable, and nothing is sent),
runs the pre-flight with the other nodes, collects the sealed shares (`dphype.flower.client.committee_client`), forwards
each tally its ciphertexts and gets the opening back, with the contributors whose ballots were left out
(`dphype.flower.tally_node`). A voter approved in the pre-flight that sends no usable shares
is named (``node <id> (no shares)``) and left out; a label two voters claim is named with its node id. Fewer
contributors than the committee's floor (`dphype.privacy.noise.min_valid_ballots`):
`dphype.flower.server.readiness.PreflightError`; a tally that refuses, fails or answers late:
`dphype.secure.committee.TallyError`; nothing released either way, and the error says what the voters were charged
(one vote each: a node votes once per request and run).

A server that takes its committee from the nodes rather than from its operator (the bundled app, the app
``dphype new`` writes) asks `connected_committee` first, the one committee finder (the committee in a committee
mode; in sum mode the connected tally nodes, which do not vote then); its ``voters`` (a `ClientGrid`) is the grid a
strategy sees afterwards, without the tallies.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common import log
from flwr.serverapp.grid import Grid
from flwr.supercore.run import Run

from dphype.checks import check_positive
from dphype.config import DPHypeConfig
from dphype.flower.grid import node_ids, pull, push, send_and_receive
from dphype.flower.server.readiness import PreflightError, remaining_nodes, wait_for_nodes
from dphype.flower.wire import (
    COMMITTEE_VOTE_TYPE,
    MAX_RESULT_WAIT,
    RECORD_KEY,
    TALLY_COLLECT,
    TALLY_COMPUTE,
    TALLY_HELLO,
    TALLY_KEY,
    TALLY_RESULT,
    TALLY_TIMEOUT,
    TALLY_TYPE,
)
from dphype.protocol import DPHypeResult, VoteRequest, precheck_request
from dphype.secure.committee import COMMITTEE_SIZE, Opening, TallyError, agreed_opening
from dphype.selection.candidates import CandidateList

#: The pre-flight of the request over the given nodes within a timeout: the nodes that answered ready
#: (`dphype.flower.server.DPHype.start` passes its own).
Preflight = Callable[[Grid, list[int], float | None], Mapping[int, Any]]


def _ask(grid: Grid, nodes: Sequence[int], content: dict[int, dict[str, Any]], timeout: float | None,
         what: str) -> dict[int, Message]:
    """Send each node its ``query.dphype_tally`` stage and return the replies by node within ``timeout``."""
    messages = [Message(RecordDict({TALLY_KEY: ConfigRecord(content[n])}), dst_node_id=n,
                        message_type=TALLY_TYPE) for n in nodes]
    return {reply.metadata.src_node_id: reply for reply in send_and_receive(grid, messages, timeout=timeout, what=what)}


def _answers(replies: dict[int, Message], tally_nodes: dict[int, int], stage: str) -> dict[int, dict[str, Any]]:
    """Each tally's answer to ``stage``; `TallyError` naming every tally that was late and every one that failed.

    The committee computes only with all its parties, so one tally missing stops the release: a tally cut off
    mid-run is named as late (the others' MPyC parties then fail or time out waiting for it).
    """
    out, late, failed = {}, [], []
    for j, node in sorted(tally_nodes.items()):
        reply = replies.get(node)
        if reply is None:
            late.append(str(j))
        elif reply.has_error():
            failed.append(f"tally {j} failed the {stage} stage ({(reply.error.reason or '')[:200]})")
        else:
            out[j] = dict(reply.content.config_records[TALLY_KEY])
    if late or failed:
        causes = ([f"tally {', '.join(late)} did not answer the {stage} stage in time (unreachable or cut off: the "
                   f"committee needs all {len(tally_nodes)} tallies)"] if late else [])
        raise TallyError(f"{'; '.join(causes + failed)}; nothing released")
    return out


def _opening(answer: dict[str, Any]) -> Opening:
    """A tally's ``result`` answer as an `Opening`; `TallyError` for a malformed one."""
    value, excluded, at = answer.get("value"), answer.get("excluded", []), answer.get("excluded_at", [])
    values: list[Any] = value if isinstance(value, list) else [value]
    if (not values or not all(isinstance(v, int) and not isinstance(v, bool) for v in values)
            or not isinstance(excluded, list) or not all(isinstance(label, str) for label in excluded)
            or not isinstance(at, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in at)
            or len(at) not in (0, len(excluded))):
        raise TallyError("a tally answered the result stage without a value and its excluded contributors; "
                         "nothing released")
    return Opening(tuple(int(v) for v in values) if isinstance(value, list) else int(values[0]), tuple(excluded),
                   tuple(int(i) for i in at))


def _hello(grid: Grid, nodes: Sequence[int], timeout: float | None) -> list[tuple[int, tuple[int, bytes]]]:
    """Each answering node's ``(tally index, public key)`` to the ``hello`` stage, by node id.

    A voter answers index -1; a node that fails or is late is left out.
    """
    replies = _ask(grid, nodes, {n: {"stage": TALLY_HELLO} for n in nodes}, timeout, "DP-Hype tally hello")
    out = []
    for node, reply in sorted(replies.items()):
        if not reply.has_error():
            answer = reply.content.config_records[TALLY_KEY]
            out.append((node, (int(cast(int, answer["index"])), cast(bytes, answer["public"]))))
    return out


def _reach_committee(grid: Grid, committee: Sequence[bytes], nodes: Sequence[int],
                   timeout: float | None) -> dict[int, int]:
    """Tally index -> node id of every ``committee`` key among ``nodes``; `TallyError` if one is unreachable."""
    found = {index: node for node, (index, key) in _hello(grid, nodes, timeout)
             if key in committee and committee.index(key) == index}
    missing = [j for j in range(len(committee)) if j not in found]
    if missing:
        raise TallyError(f"tally {missing[0]} is unreachable (no connected node answered with its key); "
                         "nothing was sent to the clients")
    return found


def _discover_committee(grid: Grid, clients: int, size: int, *, connect_timeout: float | None,
                       timeout: float | None) -> tuple[tuple[bytes, ...], tuple[int, ...]]:
    """The public keys of the ``size`` tally nodes among the connected nodes, in committee order, and their node ids.

    The committee is then only as trustworthy as the connected nodes; a client pins the keys it trusts
    (``dphype-tallies``, `dphype.node.policy`) and refuses any other committee in the pre-flight.

    Args:
        grid: The ServerApp's grid.
        clients: The number of voters.
        size: The committee's size.
        connect_timeout: Seconds to wait for the nodes to connect (``None``: no limit).
        timeout: Seconds to wait for the ``hello`` answers (``None``: no limit).

    Returns:
        The tallies' public keys and their node ids, both in committee order.

    Raises:
        dphype.flower.server.readiness.PreflightError: If fewer than ``clients + size`` nodes connect, before
            anything is sent to the clients.
        TallyError: If the tally indices that answer are not exactly ``0..size-1`` (a tally missing or answering
            twice), before anything is sent to the clients.
    """  # noqa: DOC503
    needed = clients + size
    try:
        wait_for_nodes(grid, needed, connect_timeout)
    except PreflightError:
        raise PreflightError(
            f"only {len(node_ids(grid))} of the {needed} nodes connected within {connect_timeout:g} s: start the "
            f"tally nodes\na committee release needs clients + tallies = {needed} nodes ({clients} voters "
            f"and {size} tally nodes); nothing was sent: in simulation run `dphype run` (it adds the tally nodes) "
            f"or set num-supernodes={needed} with the ClientApp mod dphype.flower.simulated_roles; in a deployment "
            "start every tally's SuperNode (clients/start-tally.sh; docs/releases.md)") from None
    connected = sorted(node_ids(grid))
    log(logging.INFO, "DP-Hype tally hello: asking the %d connected nodes which of them are the %d tallies",
        len(connected), size)
    found: dict[int, tuple[int, bytes]] = {}
    for node, (index, key) in _hello(grid, connected, timeout):
        if index < 0:  # a voter
            continue
        if index in found:
            raise TallyError(f"two nodes answer as tally {index}; nothing was sent to the clients")
        found[index] = (node, key)
    if sorted(found) != list(range(size)):
        raise TallyError(f"tallies={size} needs tally nodes 0..{size - 1} to answer, got "
                         f"{len(found)} ({', '.join(map(str, sorted(found))) or 'none'}): start the missing tallies\n"
                         "nothing was sent to the clients: in simulation give the ClientApp the mod "
                         "dphype.flower.simulated_roles (ClientApp(mods=[simulated_roles])) and run it with "
                         "`dphype run`; in a deployment start each tally's SuperNode with its dphype-tally-id "
                         "(clients/start-tally.sh)")
    return tuple(found[j][1] for j in range(size)), tuple(found[j][0] for j in range(size))


def _tally_nodes(grid: Grid, clients: int, *, connect_timeout: float | None,
                 timeout: float | None) -> tuple[int, ...]:
    """The node ids of the connected tally nodes, for a release without a committee, once ``clients`` voters connect.

    Which nodes are tallies is each node's own answer to ``hello`` (its operator's ``dphype-tally-id``), never the
    server's guess. Nodes are asked only when more than ``clients`` are connected (else every one takes part), each
    once; a node that does not answer in time is not set aside (a tally among the sampled voters refuses the
    pre-flight). While tallies leave fewer than ``clients`` other nodes it waits for more.

    Args:
        grid: The ServerApp's grid.
        clients: The number of voters the selection needs.
        connect_timeout: Seconds to wait for ``clients`` voters to connect (``None``: no limit).
        timeout: Seconds to wait for the ``hello`` answers (``None``: no limit).

    Returns:
        The tallies' node ids, sorted (empty when no more than ``clients`` nodes are connected).

    Raises:
        dphype.flower.server.readiness.PreflightError: If fewer than ``clients`` nodes besides the tallies connect
            within ``connect_timeout`` (nothing was sent to the voters).
    """  # noqa: DOC503
    deadline = None if connect_timeout is None else time.monotonic() + connect_timeout
    tallies: set[int] = set()
    asked: set[int] = set()
    while True:
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        try:
            wait_for_nodes(ClientGrid(grid, sorted(tallies)), clients, left)
        except PreflightError:
            raise PreflightError(f"only {len(node_ids(grid)) - len(tallies)} of clients={clients} voters connected "
                                 f"within {connect_timeout:g} s: start more voters, or set clients lower\n"
                                 f"(besides {len(tallies)} tally nodes, which do not vote in this release); nothing "
                                 "was sent") from None
        connected = node_ids(grid)
        fresh = sorted(n for n in connected if n not in asked)
        if len(connected) <= clients and not asked:  # no choice to make: every connected node is asked to vote
            return ()
        if fresh:
            log(logging.INFO, "DP-Hype: asking %d connected nodes whether they are tallies (%d voters are sampled "
                "among the others)", len(fresh), clients)
            asked.update(fresh)
            tallies.update(node for node, (index, _) in _hello(grid, fresh, timeout) if index >= 0)
        if len([n for n in connected if n not in tallies]) >= clients:
            return tuple(sorted(tallies))


@dataclass(frozen=True)
class Committee:
    """The tally committee a server found among the connected nodes (`connected_committee`).

    Attributes:
        grid: The ServerApp's grid.
        keys: The tallies' X25519 public keys in committee order (``DPHype(..., tallies=keys)``); empty in a mode
            without a committee.
        nodes: Their node ids in committee order (``DPHype.start(grid, committee_nodes=nodes)``); empty likewise.
        others: In a mode without a committee, the connected tally nodes (the tally nodes), which neither vote nor
            train; empty otherwise.
    """

    grid: Grid
    keys: tuple[bytes, ...] = ()
    nodes: tuple[int, ...] = ()
    others: tuple[int, ...] = ()

    @property
    def voters(self) -> Grid:
        """The grid without the tallies (a `ClientGrid`), for the strategy that trains afterwards."""
        return ClientGrid(self.grid, self.nodes + self.others)

    @property
    def selection_grid(self) -> Grid:
        """The grid the selection runs on: the whole grid with a committee (it asks the tallies), else `voters`."""
        return self.grid if self.nodes else self.voters


def connected_committee(grid: Grid, config: DPHypeConfig, size: int = COMMITTEE_SIZE, *,
                        candidates: CandidateList | None = None, connect_timeout: float | None = 600.0,
                        timeout: float | None = 3600.0) -> Committee:
    """The tally committee among the connected nodes when ``config``'s release needs one; else the tallies to skip.

    The committee in a committee mode, the tally nodes to set aside otherwise, so one ServerApp serves every release
    and its selection (`Committee.selection_grid`) and training (`Committee.voters`) reach the voters only.

    Args:
        grid: The ServerApp's grid.
        config: The selection's configuration (its release and ``clients``).
        size: The committee's size (at least 3).
        candidates: The selection's candidates, checked against ``config`` before any wait; ``None``: not checked.
        connect_timeout: Seconds to wait for ``clients + size`` nodes (a committee mode) or ``clients`` voters
            (``None``: no limit).
        timeout: Seconds to wait for the ``hello`` answers (``None``: no limit).

    Returns:
        The committee: its keys, node ids and the ``voters`` grid.

    Raises:
        dphype.flower.server.readiness.PreflightError: If fewer than ``clients + size`` nodes connect (a committee
            mode), or fewer than ``clients`` voters.
        TallyError: If the tallies that answer are not exactly ``0..size-1``.
        ValueError: If ``config``'s ``k`` exceeds the number of ``candidates``, its noise cannot be calibrated
            for them, or the planner's chance of a good pick is below ``config.min_success``
            (`dphype.protocol.selection_plan`).
    """  # noqa: DOC502
    if candidates is not None:
        precheck_request(config, candidates)  # k, the calibration, a federation too small to select
    if not config.mode.uses_committee:
        return Committee(grid, others=_tally_nodes(grid, config.clients, connect_timeout=connect_timeout,
                                                   timeout=timeout))
    keys, nodes = _discover_committee(grid, config.clients, size, connect_timeout=connect_timeout, timeout=timeout)
    return Committee(grid, keys, nodes)


class ClientGrid(Grid):
    """``grid`` without the tally nodes (their ids hidden from `get_node_ids`).

    What a strategy that samples nodes sees after a committee selection, so that no tally trains or evaluates.

    Args:
        grid: The ServerApp's grid.
        tally_nodes: The tallies' node ids.
    """

    def __init__(self, grid: Grid, tally_nodes: Sequence[int]) -> None:
        self.grid, self.tally_nodes = grid, frozenset(tally_nodes)

    def set_run(self, run: Run) -> None:
        """Set the run on the wrapped grid."""
        self.grid.set_run(run)

    @property
    def run(self) -> Run:
        """The wrapped grid's run."""
        return self.grid.run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        """A message created by the wrapped grid."""
        return self.grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        """The connected nodes' ids, without the tallies."""
        return [n for n in node_ids(self.grid) if n not in self.tally_nodes]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Push ``messages`` through the wrapped grid (`dphype.flower.grid.push`); their message ids."""
        return push(self.grid, list(messages))

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Pull the replies that have arrived through the wrapped grid (`dphype.flower.grid.pull`)."""
        return pull(self.grid, message_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """The replies that arrive within ``timeout`` (`dphype.flower.grid.send_and_receive`, a short poll)."""
        return send_and_receive(self.grid, messages, timeout=timeout)


def _labels(contributors: Sequence[int], signed: Mapping[int, tuple[str, list[bytes]]]) -> list[int] | list[str]:
    """The contributors' roster names if any signed (else node ids; an unsigned one as text, which a tally refuses)."""
    if not signed:
        return list(contributors)
    return [signed[c][0] if c in signed else str(c) for c in contributors]


def check_tally_timeout(seconds: Any) -> float:
    """The tallies' wait (``tally-timeout``) as a float in ``(0, MAX_RESULT_WAIT]``; else `ValueError`."""
    value = check_positive("tally_timeout", seconds)
    if value > MAX_RESULT_WAIT:
        raise ValueError(f"tally_timeout must be at most {MAX_RESULT_WAIT:g} s (a tally waits no longer), got "
                         f"{value:g}; the default is {TALLY_TIMEOUT:g} s")
    return value


def _name(labels: Sequence[int] | Sequence[str], contributors: Sequence[int], position: int) -> str:
    """The contributor at ``position`` of the tallies' list: its label, with its node id when the label repeats."""
    label = str(labels[position])
    twice = sum(str(other) == label for other in labels) > 1
    return f"{label} (node {contributors[position]})" if twice else label


def _charged(voters: int) -> str:
    """What the voters paid for a committee release that opened nothing: one vote each, once per run."""
    return (f"; the {voters} voters that sent their shares each recorded this one vote in their ledger (once: a "
            "node votes once per request and run, and no tally opens a request twice in a run), a new selection "
            "is a new vote")


def _attributed(agreed: Opening, labels: Sequence[int] | Sequence[str], contributors: Sequence[int],
                unattributable: set[int], silent: Sequence[int]) -> Opening:
    """``agreed`` with its exclusions named and told apart: the voters' own invalid ballots, and the unattributed.

    A contributor is unattributed when a tally found its share spoilt in a way the relay can cause
    (`dphype.secure.committee.Tally.unattributable`: every share, without a roster's signatures), or it sent no
    shares (``silent``); any other is excluded for its own ballot.
    """
    named = [str(label) for label in labels]
    at = agreed.excluded_at if agreed.excluded_at else tuple(named.index(label) for label in agreed.excluded)
    return Opening(agreed.value, tuple(_name(labels, contributors, i) for i in at if i not in unattributable),
                   unattributed=tuple(_name(labels, contributors, i) for i in at if i in unattributable)
                   + tuple(f"node {n} (no shares)" for n in silent))


def run_committee_selection(grid: Grid, request: VoteRequest, *, preflight: Preflight, timeout: float | None,
                         connect_timeout: float | None, tally_timeout: float = TALLY_TIMEOUT,
                         committee_nodes: Sequence[int] | None = None) -> DPHypeResult:
    """Argmax mode of `dphype.flower.server.DPHype.start` for its ``request``.

    Committee, pre-flight (by ``preflight``), sealed shares, tallies, index (module docstring).

    ``committee_nodes``: the node id of each tally in committee order, when the caller has just learnt them
    from the tallies' own ``hello`` (`connected_committee`); the committee is then not asked again (one
    round trip less: on a deployment, a ClientApp process on every node). They must be connected nodes; a
    wrong one fails at its tally's first stage, since only the holder of the committee key can open the
    shares sealed to it.

    Args:
        grid: The ServerApp's grid.
        request: The argmax-mode request (its ``tallies`` name the committee).
        preflight: The pre-flight over the sampled client nodes.
        timeout: Seconds per stage (``None``: no limit).
        connect_timeout: Seconds to wait for ``clients`` plus the tallies to connect when ``committee_nodes`` is
            ``None`` (``None``: no limit); with ``committee_nodes`` the voters still connected take part, a voter
            cut off since the committee was found counting as a dropout (`remaining_nodes`).
        tally_timeout: Seconds each tally's MPyC party has to check the ballots and open the result
            (`check_tally_timeout`).
        committee_nodes: The tallies' node ids in committee order, or ``None`` to find them among the connected nodes.

    Returns:
        The winner-only result (`dphype.release.ReleaseMode.release` of the agreed index).

    Raises:
        ValueError: If ``committee_nodes`` does not name one distinct node per tally.
        TallyError: If a tally is unreachable, not connected, refuses, fails or answers late, or the tallies
            disagree; nothing is released.
        dphype.flower.server.readiness.PreflightError: If too few client nodes are connected, ready or send
            their shares; nothing is released.
    """  # noqa: DOC503
    cfg = request.config
    committee = list(request.tallies)
    tally_timeout = check_tally_timeout(tally_timeout)
    if committee_nodes is None:
        wait_for_nodes(grid, cfg.clients + len(committee), connect_timeout)
        connected = sorted(node_ids(grid))
        tally_nodes = _reach_committee(grid, committee, connected, timeout)
    else:  # the committee was found among connected nodes: a node gone since then is cut off, not waited for
        connected = sorted(node_ids(grid))
        tally_nodes = dict(enumerate(int(n) for n in committee_nodes))
        if len(tally_nodes) != len(committee) or len(set(tally_nodes.values())) != len(committee):
            raise ValueError(f"committee_nodes must name {len(committee)} distinct nodes, one per tally in "
                             f"committee order, got {list(committee_nodes)!r}")
        absent = [n for n in tally_nodes.values() if n not in connected]
        if absent:
            raise TallyError(f"committee node {absent[0]} is not connected; nothing was sent to the clients")
    ready = preflight(grid, remaining_nodes(grid, tally_nodes.values(), cfg.clients, request.min_survivors), timeout)
    start = time.perf_counter()
    vote = [Message(RecordDict({RECORD_KEY: ConfigRecord(request.to_record())}), dst_node_id=n,
                    message_type=COMMITTEE_VOTE_TYPE) for n in ready]
    shares: dict[int, list[bytes]] = {}
    signed: dict[int, tuple[str, list[bytes]]] = {}  # a roster member's name and its signature of each share
    for reply in send_and_receive(grid, vote, timeout=timeout, what="DP-Hype committee vote"):
        answer = None if reply.has_error() else reply.content.config_records.get(RECORD_KEY)
        sealed = None if answer is None else answer.get("shares")
        if (isinstance(sealed, list) and len(sealed) == len(committee)
                and all(isinstance(b, bytes) for b in sealed)):  # anything else: no answer
            shares[reply.metadata.src_node_id] = cast(list[bytes], sealed)
            member, signatures = cast(ConfigRecord, answer).get("member"), cast(ConfigRecord, answer).get("signatures")
            if isinstance(member, str) and isinstance(signatures, list) and len(signatures) == len(committee):
                signed[reply.metadata.src_node_id] = (member, cast(list[bytes], signatures))
    silent = sorted(n for n in ready if n not in shares)  # approved, then no (usable) shares: named, left out
    if len(shares) < request.min_valid:
        raise PreflightError(f"only {len(shares)} clients sent their shares, fewer than the committee's minimum "
                             f"of valid ballots {request.min_valid}; run again\nthe tallies were not asked and "
                             f"nothing was released{_charged(len(shares))}")
    by_node = sorted(shares)  # in the order every tally keeps them: by label, a label sent twice by node id
    contributors = [c for _, c in sorted(zip(map(str, _labels(by_node, signed)), by_node, strict=True))]
    labels = _labels(contributors, signed)
    record = request.to_record()
    collect = {node: {**record, "stage": TALLY_COLLECT, "contributors": labels,
                      "shares": [shares[c][j] for c in contributors],
                      **({"signatures": [signed[c][1][j] if c in signed else b"" for c in contributors]}
                         if signed else {})}
               for j, node in tally_nodes.items()}
    tallies = sorted(tally_nodes.values())
    try:
        collected = _answers(_ask(grid, tallies, collect, timeout, "DP-Hype tally collect"), tally_nodes,
                             TALLY_COLLECT)
        unattributable: set[int] = set()  # shares the relay may have spoilt as much as their senders
        for j, took in sorted(collected.items()):
            invalid = took.get("invalid", [])
            if isinstance(invalid, list) and invalid:
                log(logging.WARNING, "DP-Hype tally %d did not take the shares of %s", j,
                    ", ".join(_name(labels, contributors, int(i)) for i in invalid
                              if isinstance(i, int) and 0 <= i < len(labels)))
            transit = took.get("unattributable", [])
            unattributable |= {i for i in transit if isinstance(i, int)} if isinstance(transit, list) else set()
        _answers(_ask(grid, tallies, {n: {"stage": TALLY_COMPUTE, "timeout": tally_timeout} for n in tallies}, timeout,
                      "DP-Hype tally compute"), tally_nodes, TALLY_COMPUTE)
        results = _answers(_ask(grid, tallies, {n: {"stage": TALLY_RESULT, "timeout": tally_timeout}
                                                for n in tallies},
                                tally_timeout + 5.0 if timeout is None else timeout, "DP-Hype tally result"),
                           tally_nodes, TALLY_RESULT)
        agreed = agreed_opening([_opening(a) for a in results.values()])
        if not all(0 <= i < len(labels) for i in agreed.excluded_at):
            raise TallyError("the tallies named an excluded contributor outside the list sent; nothing released")
    except TallyError as err:
        raise TallyError(f"{err}{_charged(len(shares))}", err.excluded) from None
    opened = _attributed(agreed, labels, contributors, unattributable if signed else set(range(len(labels))),
                         silent)
    result = request.mode.release(request, opened, len(contributors) + len(silent))
    log(logging.INFO, "DP-Hype (%s) selected candidate %d %s (epsilon=%.4g, %d contributors, %d ballots left out%s, "
        "%d tallies) in %.2f s after the pre-flight", request.mode.name, result.selected_index, result.selected,
        result.report.epsilon, len(contributors) + len(silent), len(opened.excluded) + len(opened.unattributed),
        f": {result.report.ballots()}" if opened.excluded or opened.unattributed else "", len(tallies),
        time.perf_counter() - start)
    return result
