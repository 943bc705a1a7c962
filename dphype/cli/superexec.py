"""``dphype superexec``: a warm SuperExec beside a ``flower-supernode --isolation process`` (one per SuperNode).

Each ClientApp task runs in a child of a fork server that imported Flower's ClientApp runtime, DP-Hype's
handlers and the ``--preload`` modules once (`dphype.flower.superexec`), instead of a fresh interpreter
per message. Runs until stopped; bad options are refused before anything starts.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``superexec`` options.

    Args:
        parser: The sub-command's parser.
    """
    # lazy import: Flower
    from dphype.flower.superexec import DEFAULT_POLL_INTERVAL

    parser.add_argument("--runtime-api-address", required=True,
                        help="the SuperNode's Runtime API, HOST:PORT (its --host and --port)")
    parser.add_argument("--insecure", action="store_true", help="connect without TLS (loopback only)")
    parser.add_argument("--root-certificates", default=None, help="PEM root certificates of the Runtime API's TLS")
    parser.add_argument("--preload", nargs="*", default=[],
                        help="more installed modules for the fork server to import once, e.g. torch (not your app's "
                             "own modules: a preloaded module is not re-imported from a later FAB)")
    parser.add_argument("--poll-interval", type=float, default=DEFAULT_POLL_INTERVAL,
                        help=f"seconds between task requests, in [0.01, 60] (default {DEFAULT_POLL_INTERVAL:g})")
    parser.add_argument("--parent-pid", type=int, default=None, help="stop when this process exits")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Serve the SuperNode's tasks until stopped (`dphype.flower.superexec.serve` ends by raising ``SystemExit``).

    Args:
        args: The parsed options.

    Returns:
        An empty result, never reached in practice.

    Raises:
        ValueError: If ``--runtime-api-address`` is not ``HOST:PORT``, ``--root-certificates`` is missing without
            ``--insecure``, or ``serve`` refuses an option.
    """
    # lazy import: Flower
    from dphype.flower.superexec import serve

    if ":" not in args.runtime_api_address:
        raise ValueError(f"--runtime-api-address must be HOST:PORT, got {args.runtime_api_address!r}")
    if not args.insecure and args.root_certificates is None:
        raise ValueError("--root-certificates is required unless --insecure is given")
    serve(args.runtime_api_address, insecure=args.insecure, root_certificates_path=args.root_certificates,
          preload=args.preload, poll_interval=args.poll_interval, parent_pid=args.parent_pid)
    return {}  # serve() checks its options before it starts, and ends by raising SystemExit when stopped
