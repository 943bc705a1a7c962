"""``dphype calibrate``: solve the total noise std sigma for (epsilon, delta, k) (Algorithm 1, line 1).

Prints sigma (std of the TOTAL noise on the released vote sum), the per-client share std for ``clients``
clients tolerating a ``dropout`` fraction (Appendix A), and the epsilon recomputed from sigma.
Heavy imports (scipy) happen inside `run` so that ``dphype --help`` stays fast.
"""

from __future__ import annotations

import argparse
from typing import Any

from dphype.cli import add_candidates_argument, add_privacy_arguments, privacy_config
from dphype.privacy.accounting import calibrate, privacy_report
from dphype.privacy.noise import min_survivors
from dphype.selection.candidates import load_candidates


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``calibrate`` options (the privacy options shared by every command).

    Args:
        parser: The sub-command's parser.
    """
    add_privacy_arguments(parser)
    add_candidates_argument(parser, default=None)
    parser.add_argument(
        "--raw-scores",
        action="store_true",
        help="Appendix F raw scores in [0, 1] (sensitivity sqrt(p); needs --candidates, gaussian noise)",
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Calibrate and report.

    Args:
        args: The parsed options.

    Returns:
        ``sigma``, the per-client ``client_std``, the recomputed ``epsilon``, the settings and the release's
        ``l2_sensitivity`` and ``min_survivors``.

    Raises:
        ValueError: For bad input (exit status 2 via `dphype.cli.main`).
    """  # noqa: DOC502
    num_candidates = None if args.candidates is None else len(load_candidates(args.candidates))
    config = privacy_config(args, num_candidates)
    release = calibrate(config.epsilon, config.delta, config.k, num_candidates=num_candidates,
                        accountant=config.accountant, noise=config.noise, raw_scores=args.raw_scores,
                        neighbouring=args.neighbouring)
    report = privacy_report(release, config.delta, clients=config.clients, dropout=config.dropout,
                            accountant=config.accountant)
    return {
        "sigma": release.sigma,
        "client_std": report.client_std,
        "epsilon": report.epsilon,
        "delta": report.delta,
        "k": release.k,
        "accountant": report.accountant,
        "noise": release.noise,
        "clients": config.clients,
        "dropout": config.dropout,
        "num_candidates": release.num_candidates,
        "raw_scores": release.raw_scores,
        "neighbouring": release.neighbouring,
        "l2_sensitivity": release.l2_sensitivity,
        "min_survivors": min_survivors(config.clients, config.dropout),
    }
