"""A ServerApp's run folder (`dphype.runs.RunFolder`) in Flower terms: opened from the run's ``Context``.

``with run_folder(context) as run:`` around a ServerApp's work creates ``<runs>/<UTC start>-<run id>/`` on the
ServerApp's host (`dphype.runs.runs_dir`), copies everything the ServerApp prints into its ``log.txt``, and at the
end writes ``result.json`` (the fields the app recorded with ``run.selected(result)`` and ``run.add(...)``; a failed
run's cause), and names the folder in the log. `save_model` writes the final model's ``ArrayRecord``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from flwr.app import ArrayRecord, Context
from flwr.common import log

from dphype.runs import RunFolder, runs_dir
from dphype.selection.plan_result import WARN_BELOW


@contextmanager
def run_folder(context: Context) -> Iterator[RunFolder]:
    """The run folder of this ServerApp run, written whole when the block ends (completed or failed).

    A run whose plan's simulated chance of a good pick (``plan.success``) is below `WARN_BELOW` (a federation too
    small to select, run with ``min-success = 0``) ends with one warning line saying so.

    Args:
        context: The ServerApp's context (its run id and run config).

    Yields:
        The run folder; record fields with ``run.add(...)``, the selection with ``result = run.selected(result)``.

    Raises:
        ValueError: If the folder cannot be created (before any work).
    """  # noqa: DOC502, DOC503
    folder = RunFolder.create(runs_dir(context.run_config), context.run_id)
    with folder.capture_output():
        log(logging.INFO, "DP-Hype: this run's folder (on the ServerApp's host): %s", folder.path)
        try:
            yield folder
        except BaseException as err:
            folder.write(err)
            log(logging.ERROR, "DP-Hype: the run failed; its cause and log are in %s", folder.path)
            raise
        path = folder.write()
        log(logging.INFO, "DP-Hype: the run's record is %s", path)
        success = (folder.record.get("plan") or {}).get("success")
        if isinstance(success, float) and success < WARN_BELOW:
            privacy = folder.record.get("privacy", {})
            log(logging.WARNING, "DP-Hype: TOO SMALL TO SELECT: clients=%s at epsilon %.3g gives a good pick with %.2f "
                "(< %g, the planner's scenario): this run tested the plumbing; its pick and model are no selection "
                "(`dphype plan` names the size that would be)", privacy.get("clients"), privacy.get("epsilon"),
                success, WARN_BELOW)


def save_model(run: RunFolder, arrays: ArrayRecord) -> Path:
    """Write the final model (a Flower ``ArrayRecord``, e.g. a strategy's ``result.arrays``) to ``run``'s ``model.npz``.

    Args:
        run: The run folder.
        arrays: The model's weights.

    Returns:
        The file.
    """
    return run.save_model({name: array.numpy() for name, array in arrays.items()})
