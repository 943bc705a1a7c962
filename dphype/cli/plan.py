"""``dphype plan``: predict a DP-Hype run before any data is touched (`dphype.selection.planner`).

Prints the simulated chance of selecting a good candidate for a range of k under a stated consensus scenario (a
model, not the user's data; and Theorem IV.1's bound for the argmax) for both kinds of release (the noisy sum and the
winner only), the recommended k of each and the recommended mode among `dphype.release.RELEASE_MODES`, and
the smallest epsilon and number of clients reaching ``--target`` in the mode of ``--release``. ``--min-success P``
makes it fail (exit status 2) below P. The chance of a good pick on the user's data is unknown
(``predicted_success``: ``None``), and ``advice`` says so; with a ballot the bench measured (the argmax release's
default ``auto``) it reports at that ballot's ``k`` and adds how far from Opt the measured releases of the cell
nearest the run landed (``within_opt``, `dphype.selection.measured`; ``--partition`` picks the iid or the Dirichlet
federations).
"""

from __future__ import annotations

import argparse
from typing import Any

from dphype.checks import check_epsilon_budget, check_probability
from dphype.cli import add_noise_arguments, add_selection_arguments
from dphype.config import DPHypeConfig
from dphype.release import release_mode, release_modes
from dphype.result import format_fields
from dphype.selection.candidates import load_candidates
from dphype.selection.measured import PARTITIONS
from dphype.selection.planner import plan, read_consensus, warnings
from dphype.selection.voting import Ballot


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``plan`` options (``--noise`` / ``--accountant`` as in every command).

    Args:
        parser: The sub-command's parser.
    """
    parser.add_argument("--clients", type=int, required=True, help="number of clients n in [2, 10000]")
    parser.add_argument("--epsilon", type=float, required=True, help="privacy budget epsilon in (0, 100]")
    parser.add_argument("--delta", type=float, required=True, help="privacy parameter delta in (0, 1)")
    parser.add_argument("--candidates", required=True,
                        help="candidate spec: table3, an integer N, table3:random:SIZE:SEED or a .json path")
    parser.add_argument("--k", type=int, default=None, help="votes per client (default: the recommended k)")
    parser.add_argument("--dropout", type=float, default=0.0, help="tolerated dropout fraction xi in [0, 1)")
    parser.add_argument("--consensus", default="moderate",
                        help="client agreement: strong, moderate (default), weak, or a loss spread sigma_loss > 0")
    parser.add_argument("--good", type=int, default=None, help="number of good candidates (default 5%% of them)")
    parser.add_argument("--target", type=float, default=0.9, help="success aimed at by min_epsilon/min_clients")
    add_selection_arguments(parser)
    add_noise_arguments(parser)
    parser.add_argument("--neighbouring", choices=("replace-one", "add-remove"), default="replace-one",
                        help="neighbouring relation of the guarantee (default replace-one)")
    parser.add_argument("--partition", choices=PARTITIONS, default=None,
                        help="how your data is split across the clients, for the measured cell the plan quotes: iid "
                             "or dirichlet (label skew); default unknown: every measured partition")
    parser.add_argument("--repetitions", type=int, default=200, help="simulated runs per point (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the simulation (default 0)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Plan and report.

    Args:
        args: The parsed options.

    Returns:
        The plan (`dphype.selection.plan_result.Plan.to_dict`, with its ``advice``).

    Raises:
        ValueError: For bad input, or a predicted success below ``--min-success`` (exit status 2 via
            `dphype.cli.main`).
    """  # noqa: DOC502
    check_epsilon_budget(args.epsilon)  # before any simulation: the bound every command applies
    if args.min_success is not None:
        check_probability("min_success", args.min_success)
    candidates = load_candidates(args.candidates)
    consensus = read_consensus(args.consensus)
    mode = release_mode(args.release)
    ballot = mode.check_ballot(args.ballot)
    k = args.k
    if k is None and Ballot.parse(ballot).from_public_facts:  # a share or auto ballot's k follows from public facts
        k = mode.votes_per_client(DPHypeConfig(epsilon=args.epsilon, delta=args.delta, k=1, clients=args.clients,
                                               dropout=args.dropout, neighbouring=args.neighbouring,
                                               release=args.release, ballot=ballot), len(candidates))
    result = plan(args.clients, args.epsilon, args.delta, candidates.feature_space(), len(candidates), k=k,
                  dropout=args.dropout, consensus=consensus, num_good=args.good, target=args.target, rule=args.rule,
                  noise=args.noise, accountant=args.accountant, neighbouring=args.neighbouring,
                  repetitions=args.repetitions, seed=args.seed, release=mode, releases=release_modes(),
                  ballot=ballot, partition=args.partition)
    warnings(result, args.min_success)
    return result.to_dict()


def render(result: dict[str, Any]) -> str:
    """The plan as text: its one-line ``advice`` first, then every other field (`dphype.result.format_fields`)."""
    return f"advice: {result['advice']}\n" + format_fields({k: v for k, v in result.items() if k != "advice"})
