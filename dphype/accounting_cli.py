"""``dphype calibrate``: solve the total noise std sigma for (epsilon, delta, k) (Algorithm 1, line 1).

Prints sigma (std of the TOTAL noise on the released vote sum), the per-client share std for ``clients``
clients tolerating a ``dropout`` fraction (Appendix A), and the epsilon recomputed from sigma.
Heavy imports (scipy) happen inside :func:`run` so that ``dphype --help`` stays fast.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``calibrate`` options."""
    parser.add_argument("--epsilon", type=float, required=True, help="privacy budget epsilon > 0")
    parser.add_argument("--delta", type=float, required=True, help="privacy parameter delta in (0, 1)")
    parser.add_argument("--k", type=int, required=True, help="votes per client (>= 1)")
    parser.add_argument("--clients", type=int, default=50, help="number of clients n >= 2 (default 50)")
    parser.add_argument(
        "--dropout", type=float, default=0.0, help="tolerated dropout fraction xi in [0, 1) (default 0)"
    )
    parser.add_argument(
        "--accountant",
        choices=("analytic", "rdp"),
        default=None,
        help="analytic (Balle-Wang, default for gaussian) or rdp (Thm I.1; required for skellam)",
    )
    parser.add_argument(
        "--noise", choices=("gaussian", "skellam"), default="gaussian", help="noise kind (default gaussian)"
    )
    parser.add_argument(
        "--candidates",
        default=None,
        help="number of candidates p, or a candidate spec (table3, table3:random:SIZE:SEED, file.json)",
    )
    parser.add_argument(
        "--neighbours",
        choices=("replace-one", "add-remove"),
        default="replace-one",
        help="neighbouring relation: replace-one (the paper's, L2 sqrt(2k); default) or add-remove (L2 sqrt(k))",
    )
    parser.add_argument(
        "--raw-scores",
        action="store_true",
        help="Appendix F raw scores in [0, 1] (sensitivity sqrt(p); needs --candidates, gaussian noise)",
    )


def _num_candidates(value: str | None) -> int | None:
    if value is None:
        return None
    if value.strip().lstrip("+-").isdigit():
        return int(value)
    from dphype.candidates import load_candidates

    return len(load_candidates(value))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Calibrate and report; bad input raises ``ValueError`` (exit status 2 via ``dphype.cli``)."""
    from dphype.accounting import calibrate, check_clients, check_dropout, privacy_report
    from dphype.noise import min_survivors

    clients = check_clients(args.clients)
    dropout = check_dropout(args.dropout)
    release = calibrate(
        args.epsilon,
        args.delta,
        args.k,
        num_candidates=_num_candidates(args.candidates),
        accountant=args.accountant,
        noise=args.noise,
        raw_scores=args.raw_scores,
        neighbours=args.neighbours,
    )
    report = privacy_report(release, args.delta, clients=clients, dropout=dropout, accountant=args.accountant)
    return {
        "sigma": release.sigma,
        "client_std": report.client_std,
        "epsilon": report.epsilon,
        "delta": report.delta,
        "k": release.k,
        "accountant": report.accountant,
        "noise": release.noise,
        "clients": clients,
        "dropout": dropout,
        "num_candidates": release.num_candidates,
        "raw_scores": release.raw_scores,
        "neighbours": release.neighbours,
        "l2_sensitivity": release.l2_sensitivity,
        "min_survivors": min_survivors(clients, dropout),
    }
