"""A run's folder: what every run of a DP-Hype app leaves on disk, and how the ``dphype`` commands find it.

Each run writes ``<runs>/<YYYYMMDD-HHMMSS>-<run id>/`` (UTC start time, Flower's run id; mode 0700) on the ServerApp's
host:

* ``result.json`` -- the run's record: the selection's `dphype.result.DPHypeResult.to_dict` fields (pick,
  candidates, privacy report, notes), whatever the app adds (each phase's guarantee and the composed one, the final
  model's accuracy and its baseline), and the run's ``run_id``, ``folder``, ``status``, ``started``, ``finished``,
  ``seconds`` and ``selection_seconds``. A field is present when it was measured and absent otherwise (no ``null``
  placeholders at the top level). `dphype.result.DPHypeResult.load` reads the selection back from it. A failed
  run's record is ``{"format": FAILURE_FORMAT, "error": ...}`` with the same run fields.
* ``model.npz`` -- the final model's weights, one array per name of the Flower ``ArrayRecord`` (NumPy's ``.npz``:
  every framework reads it, ``numpy.load(path)`` without pickle, so loading it runs no code).
* ``log.txt`` -- everything the ServerApp printed during the run (what ``flwr run --stream`` shows), without colour
  codes.

Where ``<runs>`` is (`runs_dir`): the ``DPHYPE_RUNS_DIR`` environment variable of the ServerApp's process (``dphype
run`` sets it: by default the app folder's ``runs/``), else the run config's ``runs-dir``, else ``runs`` in the
ServerApp process's working folder (in a deployment, the SuperLink's). No Flower import here.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from dphype.result import FAILURE_FORMAT, RESULT_FORMAT, DPHypeResult, format_table
from dphype.strict_json import jsonable

#: Environment variable naming the runs folder on the ServerApp's host (`runs_dir`); ``dphype run`` sets it.
RUNS_ENV = "DPHYPE_RUNS_DIR"
#: Run-config key naming the runs folder (`runs_dir`).
RUNS_KEY = "runs-dir"
#: The runs folder's name when nothing names one.
DEFAULT_RUNS = "runs"
#: The files of a run folder.
RECORD_FILE, MODEL_FILE, LOG_FILE = "result.json", "model.npz", "log.txt"
#: ANSI escape sequences (Flower's coloured log levels).
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
#: A run folder's name: start time and run id.
_NAME = re.compile(r"^(\d{8}-\d{6})-(\d+)$")


def runs_dir(run_config: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> Path:
    """The runs folder of a ServerApp: `RUNS_ENV`, else the run config's `RUNS_KEY`, else `DEFAULT_RUNS` (absolute).

    Args:
        run_config: The run's config.
        environ: The process environment (default ``os.environ``).

    Returns:
        The absolute path (relative ones are taken from the process's working folder).

    Raises:
        ValueError: If ``runs-dir`` is not a string.
    """
    named = (os.environ if environ is None else environ).get(RUNS_ENV) or run_config.get(RUNS_KEY) or DEFAULT_RUNS
    if not isinstance(named, str):
        raise ValueError(f"run config {RUNS_KEY} must be a folder path (a string), got {named!r}")
    return Path(named).expanduser().absolute()


def strip_colours(text: str) -> str:
    """``text`` without ANSI escape sequences (terminal colours)."""
    return _ANSI.sub("", text)


@dataclass
class RunFolder:
    """One run's folder and its record, written as the run goes (see the module docstring for the layout).

    Attributes:
        path: The folder.
        run_id: Flower's run id.
        record: The fields of ``result.json`` so far.
    """

    path: Path
    run_id: int
    record: dict[str, Any] = field(default_factory=dict)
    _start: float = field(default_factory=time.perf_counter, repr=False)

    @classmethod
    def create(cls, runs: Path, run_id: int, now: datetime | None = None) -> RunFolder:
        """Create the folder ``<runs>/<UTC start>-<run_id>/`` (mode 0700; and ``runs``); refused if it exists.

        Args:
            runs: The runs folder.
            run_id: Flower's run id.
            now: The start time (default: now, UTC).

        Returns:
            The run folder, its record holding the run's id, folder and start time.

        Raises:
            ValueError: If the folder cannot be created there (naming it and the fix).
        """
        now = now or datetime.now(UTC)
        path = runs / f"{now.strftime('%Y%m%d-%H%M%S')}-{int(run_id)}"
        try:
            runs.mkdir(parents=True, exist_ok=True)
            path.mkdir(mode=0o700)  # the model and the server's log: the owner's alone
            path.chmod(0o700)  # whatever the umask took away
        except OSError as err:
            raise ValueError(f"cannot create the run folder {path} ({err.strerror}): set {RUNS_ENV} to a writable "
                             f"folder\n(or the run config's {RUNS_KEY})") from None
        return cls(path, int(run_id), {"run_id": int(run_id), "folder": str(path),
                                       "started": now.isoformat(timespec="seconds")})

    def add(self, **fields: Any) -> None:
        """Add fields to the record (``None`` values are left out: absent means not measured)."""
        self.record.update({key: value for key, value in fields.items() if value is not None})

    def selected(self, result: DPHypeResult) -> DPHypeResult:
        """Record the selection and return the result naming this folder.

        The record gets `dphype.result.DPHypeResult.to_dict`'s fields (the planner's advice among them, ``plan``)
        and, the first time, ``selection_seconds`` (from the run's start to the pick); a later call (the result with
        its private evaluation) updates the fields.

        Args:
            result: The selection's result.

        Returns:
            The result with ``folder`` set, so that its summary names this folder.
        """
        named = replace(result, folder=str(self.path))
        self.add(**named.to_dict())
        self.record.setdefault("selection_seconds", round(time.perf_counter() - self._start, 3))
        return named

    def save_model(self, arrays: Mapping[str, np.ndarray]) -> Path:
        """Write the final model's weights to ``model.npz`` (one array per name) and name it in the record.

        Args:
            arrays: The weights by name (a Flower ``ArrayRecord``'s keys).

        Returns:
            The file.
        """
        path = self.path / MODEL_FILE
        with path.open("wb") as out:
            np.savez(out, **{str(name): np.asarray(value) for name, value in arrays.items()})  # type: ignore[arg-type]
        self.add(model=MODEL_FILE)
        return path

    def write(self, error: BaseException | None = None) -> Path:
        """Write ``result.json``: the record with ``status``, ``finished`` and ``seconds``; a failure's cause.

        Args:
            error: What stopped the run; ``None`` for a completed run.

        Returns:
            The file.
        """
        if error is None:
            self.add(status="completed")
        else:  # what a failed run leaves: its cause, never a half record read as a result
            self.record = {"format": FAILURE_FORMAT, "error": f"{type(error).__name__}: {error}",
                           **{key: self.record[key] for key in ("run_id", "folder", "started") if key in self.record},
                           "status": "failed"}
        self.add(finished=datetime.now(UTC).isoformat(timespec="seconds"),
                 seconds=round(time.perf_counter() - self._start, 3))
        path = self.path / RECORD_FILE
        record = {key: value for key, value in jsonable(self.record).items() if value is not None}
        path.write_text(json.dumps(record, indent=1, sort_keys=True, allow_nan=False) + "\n", encoding="utf-8")
        return path

    @contextmanager
    def capture_output(self) -> Iterator[None]:
        """Within the block, copy everything written to ``sys.stdout`` and ``sys.stderr`` into ``log.txt``.

        The streams' ``write`` is wrapped, not the streams replaced, so handlers that hold them are copied too, and
        so are the streams of the ``flwr`` logger's handlers (Flower's console log, wherever it writes); colour codes
        are stripped; the streams are restored after the block.

        Yields:
            Nothing.
        """
        lock = threading.Lock()
        handlers = [h.stream for h in logging.getLogger("flwr").handlers if isinstance(h, logging.StreamHandler)]
        streams = list({id(stream): stream for stream in [sys.stdout, sys.stderr, *handlers]}.values())
        with (self.path / LOG_FILE).open("w", encoding="utf-8") as log:

            def tee(write: Any) -> Any:
                def copy(text: str) -> int:
                    written = write(text)
                    with lock:
                        log.write(strip_colours(text))
                        log.flush()
                    return int(written or 0)
                return copy

            saved = []  # (stream, its own write attribute or None)
            for stream in streams:
                own = getattr(stream, "__dict__", {}).get("write")
                try:
                    stream.write = tee(stream.write)
                except AttributeError:  # a stream that takes no attribute: not copied
                    continue
                saved.append((stream, own))
            try:
                yield
            finally:
                for stream, own in saved:
                    if own is None:
                        del stream.write
                    else:
                        stream.write = own


def read_record(folder: Path) -> dict[str, Any]:
    """A run folder's ``result.json``.

    Args:
        folder: The run folder.

    Returns:
        The record.

    Raises:
        FileNotFoundError: If the folder has no record (a run that is still going, or was killed), naming it.
        ValueError: If the record is not a JSON object, naming the file.
    """
    path = folder / RECORD_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{folder} holds no {RECORD_FILE}: the run is still going, or was killed before it "
                                f"ended\nits {LOG_FILE} says how far it got")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"{path} is not a run record (a JSON object): {err}") from None
    if not isinstance(record, dict):
        raise ValueError(f"{path} is not a run record (a JSON object), it holds a {type(record).__name__}")
    return record


def run_folders(runs: Path) -> list[Path]:
    """The run folders in ``runs``, oldest first (by their names' start time); empty when there is none."""
    if not runs.is_dir():
        return []
    return sorted((p for p in runs.iterdir() if p.is_dir() and _NAME.match(p.name)), key=lambda p: p.name)


def find_run(runs: Path, ref: str) -> Path:
    """The run folder ``ref`` names: a folder path, a folder name in ``runs``, a run id, or ``last``.

    Args:
        runs: The runs folder.
        ref: The reference.

    Returns:
        The run folder.

    Raises:
        FileNotFoundError: If no run folder matches (naming ``runs`` and how to list them).
    """
    folders = run_folders(runs)
    given = Path(ref).expanduser()
    if (given / RECORD_FILE).is_file() or (given.is_dir() and _NAME.match(given.absolute().name)):
        return given.absolute()
    matches = (folders[-1:] if ref == "last" else
               [p for p in folders if p.name == ref or _NAME.match(p.name).group(2) == ref])  # type: ignore[union-attr]
    if not matches:
        raise FileNotFoundError(f"no run {ref!r} in {runs}: give a run folder, its name or run id "
                                "(`dphype runs` lists them) or 'last'")
    return matches[-1]


def describe(folder: Path) -> dict[str, Any]:
    """One row of ``dphype runs``: the run's folder name, status, pick, guarantee and accuracy where recorded."""
    try:
        record = read_record(folder)
    except (FileNotFoundError, ValueError):
        return {"run": folder.name, "status": "no record"}
    row: dict[str, Any] = {"run": folder.name, "status": record.get("status", "unknown")}
    if record.get("format") == RESULT_FORMAT:
        row["pick"] = ", ".join(f"{key}={value}" for key, value in record["best_params"].items())
        row["selection_epsilon"] = record["privacy"]["epsilon"]
        if isinstance(record.get("run"), dict):  # a run that also trained: the composed guarantee, if any
            row["run_epsilon"] = record["run"].get("epsilon") or "none"
    else:
        row["error"] = str(record.get("error", ""))[:80]
    for key in ("accuracy", "baseline", "seconds"):
        if isinstance(record.get(key), (int, float)):
            row[key] = record[key]
    return row


def list_table(runs: Path) -> str:
    """``dphype runs``' text: one row per run folder, oldest first, or a line saying there is none."""
    rows = [describe(folder) for folder in run_folders(runs)]
    if not rows:
        return f"no runs in {runs} (each `dphype run` writes one there)"
    return f"{len(rows)} runs in {runs}:\n" + format_table(rows)
