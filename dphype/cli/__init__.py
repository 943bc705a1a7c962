"""The ``dphype`` console script.

Each sub-command's module is named after the command (the only module names that repeat in the package:
``dphype/cli/roster.py`` drives `dphype.secure.roster`) and exposes two functions:
``add_arguments(parser)`` and ``run(args) -> dict``. The dict is printed as readable
text (`dphype.result.format_fields`, or the module's own ``render(result) -> str``), or with
``--json`` as one JSON object on the last line of standard output instead.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from dphype.strict_json import jsonable

#: sub-command -> (module implementing add_arguments/run, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "calibrate": ("dphype.cli.calibrate", "solve the total noise std sigma for (epsilon, delta, k)"),
    "plan": ("dphype.cli.plan", "recommend k, smallest epsilon and n under a scenario; quote what was measured"),
    "ledger": ("dphype.node.ledger", "show this node's privacy ledger: recorded votes and their composed epsilon"),
    "roster": ("dphype.cli.roster", "a federation's roster of known members: keygen, init, add, show, check"),
    "new": ("dphype.cli.new", "write a runnable Flower app with DP-Hype (offline, from the package's template)"),
    "run": ("dphype.cli.run", "run a Flower app with DP-Hype in a local simulation (private SuperLink, free ports; "
            "exit status 1 with the cause when the run fails)"),
    "runs": ("dphype.cli.runs", "list the run folders of an app's past runs (runs/<date>-<run id>/)"),
    "show": ("dphype.cli.show", "print one past run: its pick, guarantees, accuracy and files (--json: result.json)"),
    "doctor": ("dphype.cli.doctor", "what a SuperNode of the bundled app would enforce (policy, roster, tallies, "
               "certificates, ledger), checked before it joins; exit status 2 on a contradiction"),
    "superexec": ("dphype.cli.superexec", "a warm SuperExec for a SuperNode in process isolation: ClientApp tasks "
                  "forked from a process that imported their code once"),
    "demo": ("dphype.cli.demo", "the bundled Flower app on Adult: DP-Hype's argmax release (3 simulated tally nodes "
             "release only the winner; --release sum: the noisy vote sum over SecAgg+), then FedAvg with the winner"),
    "pareto": ("dphype.cli.pareto", "DPareto privacy-utility Pareto front search"),
    "compare": ("dphype.cli.compare", "federated DP-Hype vs central private tuning on one task"),
    "bench": ("dphype.cli.bench", "measure k on your app's Task over a public proxy data set (bench ksweep --proxy, "
              "any folder); the paper's benchmarks (from a dphype repository checkout)"),
}


#: sub-command -> package of the repository checkout run as ``python -m PACKAGE``: programs beside the library, not
#: part of it (the benchmark drivers, `dphype.cli.bench.paper_study`); run in a child process, never imported.
PROGRAMS: dict[str, str] = {"bench": "simulations"}


class UsageError(ValueError):
    """Bad command-line input; printed without a traceback."""


class RunFailedError(RuntimeError):
    """A Flower run that a command started ended without its result; printed as one line, exit status 1."""


class Stopped(KeyboardInterrupt):
    """The command was stopped by a signal (SIGTERM or SIGINT); printed as one line, exit status 128 + signal.

    A ``KeyboardInterrupt``, so that whatever the command started is stopped and removed on the way out, as
    after Ctrl-C (`dphype.flower.local.LocalSuperLink.close`).

    Args:
        signum: The signal's number.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


#: The signals that stop a command: what a service manager or ``timeout`` sends, and Ctrl-C.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def _handling(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """Within the block ``handler`` handles `STOP_SIGNALS`; the handlers before it come back after it.

    Only in the main thread (elsewhere Python delivers no signal): elsewhere nothing changes.

    Args:
        handler: The signal handler.

    Yields:
        Nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, previous in before.items():
            signal.signal(sig, previous)


def stop_on_signals() -> contextlib.AbstractContextManager[None]:
    """Within the block, SIGTERM and SIGINT raise `Stopped`; a second one while it unwinds is ignored.

    The handlers before the block are restored after it; only in the main thread (`_handling`).

    Returns:
        The context manager.
    """

    def stop(signum: int, frame: Any) -> None:
        for sig in STOP_SIGNALS:  # the clean-up that follows is not interrupted
            signal.signal(sig, signal.SIG_IGN)
        _RECEIVED[:] = [signum]
        raise Stopped(signum)

    _RECEIVED.clear()
    return _handling(stop)


#: The stop signal `stop_on_signals`' block received, if any.
_RECEIVED: list[int] = []


def stop_signal(err: BaseException) -> int | None:
    """The stop signal behind ``err``, or ``None`` when ``err`` is not the unwinding of a stop.

    A `Stopped` that interrupts a C extension's import surfaces as that import's ``ImportError`` ("initialization
    failed"), so the block's received signal counts, whatever exception unwinds it.

    Args:
        err: The exception that ended a `stop_on_signals` block.

    Returns:
        The signal's number (``SIGINT`` for a plain ``KeyboardInterrupt``), or ``None``.
    """
    if isinstance(err, Stopped):
        return err.signum
    if _RECEIVED:
        return _RECEIVED[0]
    return int(signal.SIGINT) if isinstance(err, KeyboardInterrupt) else None


# ------------------------------------------------------------------ options shared by every command
def add_privacy_arguments(parser: argparse.ArgumentParser) -> None:
    """DP-Hype's privacy options, with the same meaning and defaults in every command.

    They are the fields of `dphype.config.DPHypeConfig`: ``--epsilon``, ``--delta``, ``--k``, ``--clients``,
    ``--dropout``, ``--noise``, ``--accountant`` and ``--neighbouring``.

    Args:
        parser: The sub-command's parser.
    """
    parser.add_argument("--epsilon", type=float, default=1.0,
                        help="privacy budget epsilon in (0, 100] (above it no privacy; default 1)")
    parser.add_argument("--delta", type=float, default=1e-5, help="privacy parameter delta in (0, 1) (default 1e-5)")
    parser.add_argument("--k", type=int, default=5, help="votes per client, in [1, candidates] (default 5)")
    parser.add_argument("--clients", type=int, default=50, help="number of clients n in [2, 10000] (default 50)")
    parser.add_argument("--dropout", type=float, default=0.0,
                        help="tolerated dropout fraction xi in [0, 1) (default 0)")
    add_noise_arguments(parser)
    parser.add_argument("--neighbouring", choices=("replace-one", "add-remove"), default="replace-one",
                        help="neighbouring relation: replace-one (the paper's, L2 sqrt(2k); default) or add-remove "
                             "(L2 sqrt(k))")


def add_selection_arguments(parser: argparse.ArgumentParser, *, release: str = "sum") -> None:
    """``--rule``, ``--min-success``, ``--release`` and ``--ballot``.

    How the server selects on the release, when it refuses to run, and what it releases.

    Args:
        parser: The sub-command's parser.
        release: The default of ``--release``.
    """
    # lazy import: start-up: `dphype --help` imports only the standard library
    from dphype.selection.rules import DEFAULT_RULE, check_rule, rule_names, selection_rule

    def rule(text: str) -> str:
        """``--rule``'s value: a registered rule (a retired name is refused naming its new one)."""
        try:
            return check_rule(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    described = ", ".join(f"{name} ({selection_rule(name).description})" for name in rule_names())
    parser.add_argument("--rule", type=rule, choices=rule_names(), default=DEFAULT_RULE,
                        help=f"selection rule on the released noisy sum: {described}; default {DEFAULT_RULE}; every "
                             "rule is post-processing")
    parser.add_argument("--min-success", type=float, default=None,
                        help="refuse to run when the planner's scenario simulates a smaller chance of a good pick")
    # lazy import: start-up: `dphype --help` imports only the standard library
    from dphype.release import RELEASE_MODES

    parser.add_argument("--release", choices=RELEASE_MODES.names(), default=release,
                        help="release mode: " + "; ".join(f"{name} ({mode.released})"
                                                          for name, mode in RELEASE_MODES.items())
                             + f"; default {release}")
    graded = " or ".join(name for name, mode in RELEASE_MODES.items() if mode.graded_ballots)
    parser.add_argument("--ballot", default=None,
                        help="the clients' ballot: top-k (with --k), rank:D[:BITS] or score:M[:BITS] (graded, "
                             f"{graded} release only); default: the release mode's default_ballot")


def add_noise_arguments(parser: argparse.ArgumentParser) -> None:
    """``--noise`` and ``--accountant``: the same choices and defaults in every command.

    Args:
        parser: The sub-command's parser.
    """
    # lazy import: start-up: `dphype --help` imports only the standard library
    from dphype.checks import ACCOUNTANTS, DEFAULT_NOISE
    from dphype.privacy.noise_kinds import noise_kind, noise_kind_names

    kinds = [noise_kind(name) for name in noise_kind_names()]
    parser.add_argument("--noise", choices=noise_kind_names(), default=DEFAULT_NOISE,
                        help="noise kind: " + ", ".join(f"{kind.name} ({kind.description})" for kind in kinds)
                             + f"; default {DEFAULT_NOISE}")
    defaults = ", ".join(f"{kind.default_accountant} for {kind.name}" for kind in kinds)
    analytic = " or ".join(kind.name for kind in kinds if "analytic" in kind.accountants)
    parser.add_argument("--accountant", choices=("auto", *ACCOUNTANTS), default="auto",
                        help=f"auto (default: {defaults}), rdp (Thm I.1) or analytic (Balle-Wang, {analytic} only)")


def add_candidates_argument(parser: argparse.ArgumentParser, *, default: str | None = "table3") -> None:
    """Add ``--candidates SPEC`` (the same candidate specs in every command) with ``default`` to ``parser``."""
    parser.add_argument("--candidates", default=default,
                        help="candidate list: 'table3' (Table III, 100), an integer N (a random N of Table III), "
                             "'table3:random:N:SEED' or a path to a JSON list" + (f" (default {default})" if default
                                                                                  else ""))


def privacy_config(args: argparse.Namespace, num_candidates: int | None = None) -> Any:
    """The `dphype.config.DPHypeConfig` of the privacy options.

    Args:
        args: The parsed options (`add_privacy_arguments`, and `add_selection_arguments` where the command has
            them).
        num_candidates: The number of candidates, when known: ``k`` is checked against it.

    Returns:
        The configuration.

    Raises:
        ValueError: If an option is out of range, or ``k`` exceeds ``num_candidates``.
    """  # noqa: DOC502
    # lazy import: start-up: `dphype --help` imports only the standard library
    from dphype.checks import check_k
    from dphype.config import DPHypeConfig

    if num_candidates is not None:
        check_k(args.k, num_candidates)
    selection = {name: getattr(args, name) for name in ("rule", "min_success", "release", "ballot")
                 if getattr(args, name, None) is not None}
    return DPHypeConfig(epsilon=args.epsilon, delta=args.delta, k=args.k, clients=args.clients,
                        dropout=args.dropout, noise=args.noise, accountant=args.accountant,
                        neighbouring=args.neighbouring, **selection)


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """Build the parser; only the chosen sub-command's module is imported (start-up stays fast).

    Args:
        argv: The command line (without the program name); its first `COMMANDS` entry is the chosen
            sub-command, whose options are added.

    Returns:
        The parser, with every sub-command of `COMMANDS`.
    """
    parser = argparse.ArgumentParser(prog="dphype", description="DP-Hype: differentially private hyperparameter "
                                     "selection for Flower apps")
    sub = parser.add_subparsers(dest="command", required=True)
    chosen = next((a for a in argv if a in COMMANDS), None)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
        p.set_defaults(_module=module)
        if name == chosen:
            importlib.import_module(module).add_arguments(p)
    return parser


def run_program(name: str, argv: Sequence[str], refusal: str) -> int:
    """``dphype NAME ARGV`` for a `PROGRAMS` entry: ``python -m PACKAGE ARGV`` in a child, from the checkout here.

    Args:
        name: The `PROGRAMS` entry.
        argv: Its arguments.
        refusal: What the `UsageError` says outside a checkout (where to run it).

    Returns:
        The child's exit status.

    Raises:
        UsageError: Outside a repository checkout (no ``PACKAGE/__main__.py`` in the current folder).
    """
    package = PROGRAMS[name]
    if not (Path.cwd() / package / "__main__.py").is_file():
        raise UsageError(refusal)
    child = subprocess.Popen([sys.executable, "-m", package, *argv], cwd=Path.cwd())
    with forward_signals(child):
        code = child.wait()
    return 128 - code if code < 0 else code  # killed by signal N: the shell's 128 + N


def forward_signals(child: subprocess.Popen[Any]) -> contextlib.AbstractContextManager[None]:
    """Within the block, SIGTERM and SIGINT are passed on to ``child``, which stops itself and says so in one line.

    The handlers before the block are restored after it; only in the main thread (`_handling`).

    Args:
        child: The child process.

    Returns:
        The context manager.
    """

    def forward(signum: int, frame: Any) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    return _handling(forward)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``dphype`` console script: parse the command line, run the sub-command, print its result.

    One of the paper's benchmarks runs in a child process (`run_program`, `dphype.cli.bench.paper_study`); a
    sub-command's ``ValueError`` or ``FileNotFoundError`` (bad input, exit status 2), `RunFailedError` (exit status
    1) or a stop by SIGTERM or SIGINT (`stop_on_signals`; exit status 128 + the signal, after what the command
    started is stopped and removed) is printed on standard error as one line, without a traceback. argparse exits
    (status 2) on an unknown option.

    Args:
        argv: The command line without the program name; ``sys.argv[1:]`` when ``None``.

    Returns:
        The exit status: 0, 1 for a failed run, 2 for bad input, or a program's own.

    Raises:
        BaseException: Whatever else the sub-command raised (a bug), with its traceback.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        from dphype.cli.bench import paper_study, refuse_outside_checkout

        study = paper_study(argv[1:])
        if study is not None:
            try:
                return run_program("bench", study, refuse_outside_checkout(study))
            except UsageError as err:
                print(f"dphype bench: error: {err}", file=sys.stderr)
                return 2
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    module = importlib.import_module(args._module)
    try:
        with stop_on_signals():
            result = module.run(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"dphype {args.command}: error: {err}", file=sys.stderr)
        return 2
    except RunFailedError as err:
        print(f"dphype {args.command}: error: {err}", file=sys.stderr)
        return 1
    except BaseException as err:  # a stop, also one that surfaced as another exception (`stop_signal`)
        signum = stop_signal(err)
        if signum is None:
            raise
        print(f"dphype {args.command}: stopped by {signal.Signals(signum).name}: every process it started is "
              "stopped and its temporary folders are removed", file=sys.stderr)
        return 128 + signum
    if not args.json:
        # lazy import: start-up: `dphype --help` imports only the standard library
        from dphype.result import format_fields

        render = getattr(module, "render", format_fields)
        print(render(result))
    else:
        print(json.dumps(jsonable(result), allow_nan=False))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
