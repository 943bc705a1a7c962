"""``dphype bench <study>``: the DP-Hype paper's benchmark studies.

A program of the repository checkout, not of the installed library: ``python -m simulations <study> ...`` from
the repository root, or ``dphype bench <study> ...`` there, which runs the same program in a child process (the
library never imports the benchmark drivers).

Every study writes CSV files and PNG plots to ``--out`` (default ``results/<study>``), shows a progress
bar on standard error and returns a dict with at least ``seconds`` and ``outputs`` (the files written),
printed as one JSON line with ``--json``. Bad input raises ``ValueError`` before any work starts.
"""

from __future__ import annotations

import argparse
import importlib
import json
import signal
import sys
from collections.abc import Sequence
from typing import Any

from dphype.cli import stop_on_signals, stop_signal
from dphype.result import format_fields
from dphype.strict_json import jsonable
from simulations.harness import StudyRun

#: study name -> (module, one-line help)
STUDIES: dict[str, tuple[str, str]] = {
    "synthetic": ("simulations.synthetic", "Fig. 2: success probability vs k, sigma_loss, |H_good|, |H| (Sec. IV-B)"),
    "tradeoff": ("simulations.tradeoff", "Figs. 4, 5, 12, 13: DP-Hype vs Opt vs RandGuess over epsilon (Sec. V-C)"),
    "ablations": ("simulations.ablations", "App. F raw scores, App. G Feathers (corrected), App. H Subsets"),
    "resources": ("simulations.resources", "Table IV: local evaluation time/memory, SecAgg+ voting bytes/time"),
    "distributions": ("simulations.distributions", "Figs. 3, 6-8: Dirichlet label plots and accuracy histograms"),
    "secagg-profile": ("simulations.secagg_profile",
                       "in-process secure-sum round: time per stage and component, bytes, state"),
    "speed": ("simulations.speed", "batched vs sequential local evaluation, synthetic and voting timings"),
    "ksweep": ("simulations.ksweep",
               "the argmax release's k: the measured sweep against the planner's advice"),
    "ksweep-report": ("simulations.ksweep_report",
                      "the ballot grid's tables from ksweep runs: gaps behind the best k, floor per cell"),
    "ksweep-loto": ("simulations.ksweep_loto",
                    "default ballots fitted on all tasks but one, measured on the one left out, against the goals"),
    "ksweep-causes": ("simulations.ksweep_causes",
                      "why the default ballot trails the best k where it does: FedAvg collapse or depth"),
    "signal": ("simulations.signal",
               "the clients' local signal: validation schemes' noiseless and released gaps to Opt"),
    "argmax-profile": ("simulations.argmax_profile",
                       "argmax mode part by part (client shares, tallies, secure argmax on MPyC) vs the sum mode"),
    "committee": ("simulations.committee",
                  "the tally committee with ballot checks and committee noise: seconds, traffic, memory"),
    "evaluation": ("simulations.evaluation_noise",
                   "the private evaluation of the final model: its epsilon, the composed epsilon, each mean's noise"),
}


def _study_module(name: str) -> Any:
    return importlib.import_module(STUDIES[name][0])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One sub-command per study; ``--out``, ``--seed`` and ``--json`` are accepted after the study name too."""
    sub = parser.add_subparsers(dest="study", required=True, metavar="STUDY")
    for name, (_, help_text) in STUDIES.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--out", default=None, help=f"output folder (default results/{name})")
        p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
        # main() defines --json on the parent parser; accept it after the study name as well
        p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        _study_module(name).add_arguments(p)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the chosen study; returns its result dict (``study``, ``seconds``, ..., ``outputs``)."""
    if args.study not in STUDIES:
        raise ValueError(f"study must be one of {', '.join(STUDIES)}, got {args.study!r}")
    study = StudyRun(args.study, args.out or f"results/{args.study}")
    return _study_module(args.study).run(args, study)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, run the study, print its result (readable text, or with ``--json`` one JSON object on the
    last line of standard output); the exit status: 2 for bad input, which is refused before any work starts, and
    128 + the signal after SIGINT (Ctrl-C) or SIGTERM, said in one line."""
    parser = argparse.ArgumentParser(prog="dphype bench", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        with stop_on_signals():
            result = run(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"dphype bench: error: {err}", file=sys.stderr)
        return 2
    except BaseException as err:  # Ctrl-C or SIGTERM: what the study wrote so far stays (its cache resumes)
        signum = stop_signal(err)  # a stop may surface as another exception (an interrupted import's)
        if signum is None:
            raise
        print(f"dphype bench {args.study}: stopped by {signal.Signals(signum).name}", file=sys.stderr)
        return 128 + signum
    print(json.dumps(jsonable(result), allow_nan=False) if args.json else format_fields(result))
    return 0
