"""A node's memory of the requests it voted on in each run: one vote per request, whatever the server retries.

Beside the node's ledger (`dphype.node.ledger.Ledger`), in ``<ledger>.votes``: one JSON line ``{"run", "request",
"answer"}`` per vote, appended and synced (the file and, on creation, its folder) after the ledger recorded the
vote and before the vote leaves the node, so it survives what the ledger survives. ``answer`` is what the node sent
(bytes as ``{"b64": ...}``): a committee vote's sealed shares and signatures, given again to a repeated vote for
the same request in the same run at no new charge; an empty answer for a vote that is never resent (a SecAgg+
vote, and every private evaluation of the final model, `dphype.node.evaluation_policy`: their noise shares
and masks belong to one round). A crash between the ledger and this file counts the vote
as spent and forgets the answer: a later retry is charged again, never released uncharged.

Every use holds an exclusive ``fcntl.flock`` on ``<ledger>.votes.lock`` (`VoteMemory.held`), so two processes of
one node cannot both cast a vote for one request. A line that does not parse fails closed
(`dphype.node.ledger.LedgerError`: every vote is refused until the operator repairs the file).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dphype.files import append_synced
from dphype.node.ledger import LedgerError, ledger_lock


def _encode(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"b64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, list | tuple):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"b64"}:
            return base64.b64decode(value["b64"], validate=True)
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


class VoteMemory:
    """The votes a node cast, by run and request digest, in the file beside its ledger (module docstring).

    Args:
        ledger: The node's ledger file; the memory is ``<ledger>.votes``.
    """

    def __init__(self, ledger: str | os.PathLike[str]) -> None:
        file = Path(ledger).expanduser().absolute()
        self.path = file.with_name(file.name + ".votes")

    @contextlib.contextmanager
    def held(self) -> Iterator[VoteMemory]:
        """Hold the memory's exclusive lock (up to `dphype.node.ledger.LOCK_TIMEOUT` seconds) for a recall and a vote.

        Yields:
            This memory.

        Raises:
            LedgerError: The lock file cannot be opened, or another process holds it too long.
        """  # noqa: DOC502
        with ledger_lock(Path(f"{self.path}.lock"), f"the vote memory {self.path}"):
            yield self

    def recall(self, run: int, request: str) -> dict[str, Any] | None:
        """What this node answered to its vote for ``request`` in ``run`` (empty: never resent); ``None``: no vote.

        Args:
            run: The run's id.
            request: The request's digest.

        Returns:
            The answer kept, or ``None``.

        Raises:
            LedgerError: The file cannot be read or a line does not parse.
        """
        try:
            text = self.path.read_text(encoding="utf-8") if self.path.exists() else ""
            for line in text.splitlines():
                if line.strip():
                    entry = json.loads(line)
                    if (int(entry["run"]), str(entry["request"])) == (int(run), request):
                        return dict(_decode(entry["answer"]))
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise LedgerError(f"the vote memory {self.path} cannot be read ({err}); every vote is refused until an "
                              "operator repairs it") from None
        return None

    def remember(self, run: int, request: str, answer: dict[str, Any]) -> None:
        """Append the vote for ``request`` in ``run`` and its ``answer`` (``{}``: never resent), synced to disk.

        Args:
            run: The run's id.
            request: The request's digest.
            answer: What the node sent (bytes allowed), or ``{}``.

        Raises:
            LedgerError: The file cannot be written.
        """
        line = json.dumps({"run": int(run), "request": request, "answer": _encode(answer)}) + "\n"
        try:
            append_synced(self.path, line)
        except OSError as err:
            raise LedgerError(f"the vote memory {self.path} cannot be written: {err}") from err
