"""``dphype runs [APP_DIR]``: the run folders an app's runs left (`dphype.runs`), oldest first.

Also where ``dphype run`` puts them (`app_runs_dir`) and finds its run's record (`run_record`).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dphype.runs import DEFAULT_RUNS, RUNS_KEY, describe, list_table, read_record, run_folders


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``dphype runs``.

    Args:
        parser: The sub-command's parser.
    """
    parser.add_argument("app", nargs="?", default=".", help="the app's folder (default: the current one)")
    add_runs_dir_argument(parser)


def add_runs_dir_argument(parser: argparse.ArgumentParser) -> None:
    """``--runs-dir``: where ``dphype runs`` and ``dphype show`` look (and ``dphype run`` writes).

    Args:
        parser: The sub-command's parser.
    """
    parser.add_argument("--runs-dir", default=None,
                        help="the run folders' folder (default: the app's run config's runs-dir, else APP/runs)")


def app_runs_dir(app: Path, run_config: Mapping[str, Any], runs_dir: str | None = None) -> Path:
    """Where an app's runs go under ``dphype run``: ``runs_dir``, else the run config's ``runs-dir``, else ``runs``.

    A relative path is relative to the app folder.

    Args:
        app: The app's folder.
        run_config: The app's run config (with the overrides).
        runs_dir: ``--runs-dir``, if given.

    Returns:
        The absolute folder.

    Raises:
        ValueError: If the run config's ``runs-dir`` is not a string.
    """
    named = runs_dir or run_config.get(RUNS_KEY) or DEFAULT_RUNS
    if not isinstance(named, str):
        raise ValueError(f"run config {RUNS_KEY} must be a folder path (a string), got {named!r}")
    return (app / Path(named).expanduser()).absolute()


def folder_of(args: argparse.Namespace) -> Path:
    """The runs folder ``app`` and ``--runs-dir`` name (`app_runs_dir`; the app's run config where it has one)."""
    # lazy import: Flower
    from dphype.flower.local import app_run_config, is_flower_app

    app = Path(args.app).expanduser().absolute()
    return app_runs_dir(app, app_run_config(app) if is_flower_app(app) else {}, args.runs_dir)


def run_record(runs: Path, run_id: int | None, before: list[Path]) -> dict[str, Any] | None:
    """The record of the run ``dphype run`` just ran: its folder in ``runs`` (new since ``before``); ``None`` if none.

    Args:
        runs: The runs folder.
        run_id: Flower's run id (``None``: the newest new folder).
        before: The run folders there before the run.

    Returns:
        The record (`dphype.runs.read_record`), or ``None`` when the run wrote no folder or no record.
    """
    new = [p for p in run_folders(runs) if p not in before]
    if run_id is not None:
        new = [p for p in new if p.name.endswith(f"-{run_id}")]
    try:
        return read_record(new[-1]) if new else None
    except (FileNotFoundError, ValueError):
        return None


def run(args: argparse.Namespace) -> dict[str, Any]:
    """List the run folders.

    Args:
        args: The parsed options.

    Returns:
        The runs ``folder`` and one row per run (``runs``): its folder name, status, pick, epsilon, accuracy.
    """
    folder = folder_of(args)
    return {"folder": str(folder), "runs": [describe(p) for p in run_folders(folder)]}


def render(result: dict[str, Any]) -> str:
    """The runs as a table."""
    return list_table(Path(result["folder"]))

