"""``dphype show RUN``: one run's record (`dphype.runs`) as text, or with ``--json`` its ``result.json``.

``RUN`` is a run folder, its name or run id in the app's runs folder (``dphype runs`` lists them), or ``last``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from dphype.cli.runs import add_runs_dir_argument, folder_of
from dphype.result import RESULT_FORMAT, summarize_run
from dphype.runs import LOG_FILE, MODEL_FILE, RECORD_FILE, find_run, read_record


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``dphype show``.

    Args:
        parser: The sub-command's parser.
    """
    parser.add_argument("run", help="a run folder, its name or run id (`dphype runs` lists them), or 'last'")
    parser.add_argument("--app", default=".", help="the app's folder (default: the current one)")
    add_runs_dir_argument(parser)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The run's record.

    Args:
        args: The parsed options.

    Returns:
        Its ``result.json``.

    Raises:
        FileNotFoundError: If no run matches, or its folder has no record (exit status 2).
    """  # noqa: DOC502
    return read_record(find_run(folder_of(args), args.run))


def render(record: dict[str, Any]) -> str:
    """The record as text: the run summary (`dphype.result.summarize_run`), or a failed run's cause; its files there."""
    head = f"run {record.get('run_id')} {record.get('status', '')} ({record.get('started', '')}, " \
           f"{record.get('seconds', 0):.0f} s)"
    body = summarize_run(record) if record.get("format") == RESULT_FORMAT else f"error: {record.get('error')}"
    folder = Path(str(record.get("folder")))
    files = [name for name in (RECORD_FILE, MODEL_FILE, LOG_FILE) if (folder / name).is_file()]
    return f"{head}\n{body}\nfolder: {record.get('folder')} ({', '.join(files)})"
