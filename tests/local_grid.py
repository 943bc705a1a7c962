"""Test harness: a Flower ``Grid`` that delivers messages to ClientApps in this process.

It lets the real ServerApp workflows (DefaultWorkflow, SecAgg+) talk to real
ClientApps (with their mods and per-node Context) without starting Ray or a
SuperLink, so protocol tests run in about a second. A ClientApp that raises is
answered with an error reply, as the Flower runtimes do. A node listed in
``silent`` has vanished, as a deployed SuperNode can: it never answers, so a
call with a timeout returns without its reply and a call without one would wait
forever (raised here as an error instead). ``node_config`` adds keys to every node's config (e.g. a DP-Hype
node policy: ``{"dphype-max-epsilon": 20.0, ...}``), as ``flower-supernode --node-config`` would.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from uuid import uuid4

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.serverapp.grid import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity


def node_id(partition_id: int) -> int:
    """The node ID that LocalGrid gives the node with ``partition_id``."""
    return 1000 + partition_id


class LocalGrid(Grid):
    """Deliver each message synchronously to ``client_app`` on one of ``num_nodes`` nodes."""

    def __init__(
        self,
        client_app: ClientApp,
        num_nodes: int,
        run_config: dict | None = None,
        silent: Iterable[int] = (),
        node_config: dict | None = None,
    ):
        self.client_app = client_app
        self.silent = {node_id(i) for i in silent}
        # Messages take their source from the process-wide task identity (as in run_simulation).
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, SUPERLINK_NODE_ID
        self._run = Run.create_empty(run_id=1)
        self.contexts = {
            node_id(i): Context(
                run_id=1,
                node_id=node_id(i),
                node_config={"partition-id": i, "num-partitions": num_nodes, **(node_config or {})},
                state=RecordDict(),
                run_config=dict(run_config or {}),
            )
            for i in range(num_nodes)
        }
        self.sent: list[Message] = []
        self.replies: list[Message] = []
        self._pending: dict[str, Message] = {}
        self.timeouts: list[float | None] = []

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Deliver each message now; its reply waits for :meth:`pull_messages` (a silent node never replies)."""
        ids = []
        for msg in messages:
            reply = self._deliver(msg)
            ids.append(msg.metadata.message_id)
            if reply is not None:
                self._pending[msg.metadata.message_id] = reply
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._pending.pop(i) for i in list(message_ids) if i in self._pending]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None):
        replies = []
        self.timeouts.append(timeout)
        for msg in messages:
            if msg.metadata.dst_node_id in self.silent and timeout is None:
                raise RuntimeError(
                    f"node {msg.metadata.dst_node_id} never answers: without a timeout "
                    "the server would wait forever"
                )
            reply = self._deliver(msg)
            if reply is not None:
                replies.append(reply)
        return replies

    def _deliver(self, msg: Message) -> Message | None:
        """Hand ``msg`` to its node's ClientApp; the reply (an error reply if the app raised), or None."""
        msg.metadata.__dict__["_message_id"] = str(uuid4())
        self.sent.append(msg)
        if msg.metadata.dst_node_id in self.silent:
            return None
        delivered = copy.deepcopy(msg)  # a transport hands each node its own copy
        try:
            reply = self.client_app(delivered, self.contexts[msg.metadata.dst_node_id])
        except Exception as exc:  # noqa: BLE001 - mirrors the runtime's error replies
            reply = Message(
                Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, f"{type(exc).__name__}: {exc}"),
                reply_to=delivered,
            )
        self.replies.append(reply)
        return reply
