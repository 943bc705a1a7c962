"""``dphype run [APP_DIR]``: run a Flower app with DP-Hype in a local simulation, and fail loudly when it fails.

The app (by default the one in the current folder: what ``dphype new`` writes, or your own) runs with ``flwr
run`` on a private ``flower-superlink --simulation`` (`dphype.flower.local.LocalSuperLink`: free loopback
ports, its own ``FLWR_HOME``, runtime dependency installation off, so nothing is downloaded and nothing is
left running or remembered between tries). The federation is the run config's ``clients`` voters (``--clients``
overrides it) and, when the release needs a committee (``release = "argmax"``), ``tallies`` (default 3) more
simulated nodes, which the ClientApp's mod `dphype.flower.simulated_roles` makes the tallies. The simulated
nodes apply the node policy in ``DPHYPE_NODE_POLICY`` (`dphype.node.policy`), read fresh on every run.

The outcome is the run's own status in the SuperLink, not ``flwr run``'s exit status (0 even when the ServerApp
raises): a run that does not complete ends the command with exit status 1 and one line naming the cause (the
ServerApp's exception, whose DP-Hype errors name their fix). Every ``--run-config`` key must be one the app
declares (Flower refuses others without naming them), checked here first, and so are the run config's DP-Hype
settings and the simulated nodes' policy limits (`check_selection`), before Flower starts. `run_locally` is the one
runner of ``dphype run`` and ``dphype demo``; SIGTERM or SIGINT stops it with everything it started
(`dphype.cli.stop_on_signals`, `dphype.flower.local.LocalSuperLink.close`).

The ServerApp keeps the run's folder (`dphype.runs`) in the app folder's ``runs/`` (``--runs-dir``, or the run
config's ``runs-dir``, names another; passed as ``DPHYPE_RUNS_DIR``): the command prints its path, ``--json`` its
``result.json``; a failed run's error names it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dphype.checks import check_int, check_positive
from dphype.cli import RunFailedError
from dphype.cli.runs import add_runs_dir_argument, app_runs_dir, run_record
from dphype.config import RUN_CONFIG_KEYS, DPHypeConfig
from dphype.node.policy import POLICY_ENV, SIMULATED_REMEDIES, NodePolicy, check_clients_limit, check_delta_limit
from dphype.protocol import precheck_request
from dphype.refusal import Refusal
from dphype.release import release_mode
from dphype.runs import RUNS_ENV, run_folders
from dphype.secure.committee import COMMITTEE_SIZE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``dphype run``.

    Args:
        parser: The sub-command's parser.
    """
    parser.add_argument("app_dir", nargs="?", default=".", help="the Flower app's folder (default: the current one)")
    parser.add_argument("--clients", type=int, default=None,
                        help="number of voters (sets the run config's clients; default: the app's)")
    parser.add_argument("--run-config", default=None,
                        help="run-config overrides as in flwr run: \"k=2 release='argmax'\" (strings quoted) or a "
                             ".toml file; every key must be declared in the app's [tool.flwr.app.config]")
    parser.add_argument("--timeout", type=float, default=3600.0, help="give up after this many seconds (default 3600)")
    add_runs_dir_argument(parser)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Check the app and its run config, run it on ``clients`` (+ tallies) simulated nodes, return the outcome.

    Args:
        args: The parsed options.

    Returns:
        The run's record (its folder's ``result.json``, `dphype.runs`); for an app that keeps no run folder, the
        ``app`` folder, ``run_id``, ``status``, ``clients``, ``tallies``, ``supernodes`` and wall ``seconds``.

    Raises:
        ValueError: For bad input (exit status 2 via `dphype.cli.main`).
        RunFailedError: If the run does not complete (exit status 1).
    """  # noqa: DOC502, DOC503
    # lazy import: Flower
    from dphype.flower.local import app_run_config, is_flower_app, parse_run_config, toml_value

    folder = Path(args.app_dir).expanduser().absolute()
    if not is_flower_app(folder):
        raise ValueError(f"app_dir {args.app_dir!r} holds no Flower app: run it in the app's folder or name the "
                         "folder\n"
                         "(a Flower app: a pyproject.toml with [tool.flwr.app]; `dphype new my-app` writes one)")
    check_positive("timeout", args.timeout)
    declared = app_run_config(folder)
    overrides = parse_run_config(args.run_config)
    if args.clients is not None:
        check_int("clients", args.clients, 2)
        overrides["clients"] = args.clients
    unknown = sorted(set(overrides) - set(declared))
    if unknown:
        raise ValueError(f"run-config key(s) {', '.join(unknown)} are not declared in the app: add them there with a "
                         f"default, or use a declared key\nundeclared in {folder / 'pyproject.toml'}'s "
                         f"[tool.flwr.app.config] (Flower refuses undeclared keys); declared: "
                         f"{', '.join(sorted(declared)) or 'none'}")
    config = {**declared, **overrides}
    if "clients" not in config:
        raise ValueError("the app's run config has no clients (the number of voters): pass --clients N")
    clients = config["clients"]
    check_int("clients", clients, 2)
    check_candidates(folder, config, check_selection(config))  # before Flower starts, as `dphype demo` checks
    for key, value in overrides.items():  # the app's own keys: what the run config can carry
        try:
            toml_value(value)
        except ValueError as err:
            raise ValueError(f"--run-config {key}={value!r}: {err}") from None
    committee = release_mode(config.get("release", DPHypeConfig.release)).uses_committee
    tallies = int(config.get("tallies", COMMITTEE_SIZE)) if committee else 0
    runs = app_runs_dir(folder, config, args.runs_dir)  # the ServerApp writes its run folder there
    before = run_folders(runs)
    start = time.perf_counter()
    try:
        outcome = run_locally(folder, overrides, clients + tallies, env={RUNS_ENV: str(runs)}, json=args.json,
                              timeout=args.timeout)
    except RunFailedError as err:
        failed = run_record(runs, None, before)
        raise RunFailedError(f"{err} (run folder: {failed['folder']})" if failed else str(err)) from None
    record = run_record(runs, outcome.run_id, before)
    return record or {"app": str(folder), "run_id": outcome.run_id, "status": outcome.status, "clients": clients,
                      "tallies": tallies, "supernodes": clients + tallies, "seconds": time.perf_counter() - start}


def check_selection(run_config: Mapping[str, Any]) -> Any:
    """The DP-Hype settings of an app's run config, checked before Flower starts; ``None`` where it has none.

    Where the run config holds DP-Hype's required keys (an app that reads
    `dphype.config.DPHypeConfig.from_run_config`), they are validated as `dphype demo` validates its options
    (`dphype.config.DPHypeConfig`), and against the policy the simulated nodes will apply (`simulated_policy`:
    its delta and fewest-contributors limits, `dphype.node.policy.check_vote_request`'s own checks), so a run that
    every node would refuse is refused here, naming the remedy of a simulation.

    Args:
        run_config: The app's run config with the overrides.

    Returns:
        The validated `dphype.config.DPHypeConfig`, or ``None`` when the run config lacks a required key.

    Raises:
        ValueError: Naming the run-config key, its range and the fix.
    """
    required = [RUN_CONFIG_KEYS[name] for name in ("epsilon", "delta", "k", "clients")]
    if not all(key in run_config for key in required):
        return None
    try:
        config = DPHypeConfig.from_run_config(run_config)
    except ValueError as err:
        raise ValueError(f"run config: {err}") from None
    policy = simulated_policy()
    try:
        check_delta_limit(config, policy)
        check_clients_limit(config, policy)
    except Refusal as refusal:
        raise ValueError(f"every simulated node would refuse this run ({refusal.local}, their policy from "
                         f"{POLICY_ENV} or its defaults): {SIMULATED_REMEDIES[refusal.code]}") from None
    return config


def check_candidates(folder: Path, run_config: Mapping[str, Any], config: DPHypeConfig | None) -> None:
    """Check ``config`` against the app's own candidates (`dphype.flower.local.app_candidates`) before Flower starts.

    What the ServerApp's `dphype.flower.DPHype` would refuse before any node works: ``k`` and the noise's
    calibration for the candidates and a federation too small to select (`dphype.protocol.precheck_request`), with
    the sum release its SecAgg+ round. An app that
    declares no candidates is checked when its ServerApp runs.

    Args:
        folder: The app's folder.
        run_config: The app's run config with the overrides.
        config: Its validated DP-Hype settings (`check_selection`), or ``None`` when it has none.

    Raises:
        ValueError: Naming the run-config key, its range and the fix.
    """  # noqa: DOC502
    # lazy import: Flower
    from dphype.flower import DPHype
    from dphype.flower.local import app_candidates

    candidates = app_candidates(folder, run_config)
    if config is None or candidates is None:
        return
    try:
        precheck_request(config, candidates)  # k, the calibration, a federation too small to select
        if not config.mode.uses_committee:  # the committee's keys come from its nodes
            DPHype(candidates, config)  # its SecAgg+ round
    except ValueError as err:
        raise ValueError(f"run config: {err} (the app's {len(candidates)} candidates): change it with --run-config "
                         "or in pyproject.toml") from None


def simulated_policy() -> Any:
    """The policy `run_locally`'s simulated nodes apply (`dphype.node.policy.POLICY_ENV`); `ValueError` if invalid."""
    # lazy import: Flower
    from dphype.flower.client.policy_client import environment_policy

    return NodePolicy.from_node_config(environment_policy())


def run_locally(app: Path, run_config: Mapping[str, Any], supernodes: int, *, env: Mapping[str, str] | None = None,
                json: bool = False, timeout: float | None = None) -> Any:
    """Run ``app`` on a private local SuperLink (`dphype.flower.local.LocalSuperLink`); raise unless completed.

    Args:
        app: The Flower app's folder.
        run_config: The run-config overrides.
        supernodes: How many simulated nodes.
        env: Variables for the SuperLink and everything it starts (e.g. the nodes' policy).
        json: Whether the command prints JSON: Flower's log then goes to stderr, so that stdout ends with it.
        timeout: Seconds before the run is given up (``None``: no limit).

    Returns:
        The completed run's `dphype.flower.local.RunOutcome`.

    Raises:
        RunFailedError: With one line naming the cause, if the run did not complete.
    """
    # lazy import: Flower
    from dphype.flower.local import LocalSuperLink

    with LocalSuperLink(env=env) as superlink:
        outcome = superlink.run(app, run_config=run_config, supernodes=supernodes,
                                stdout=sys.stderr if json else None, timeout=timeout)
    if not outcome.completed:
        fix = "; give it longer with --timeout" if outcome.timed_out else ""
        cause = outcome.cause()
        if "in their node config" in cause:  # a node's remedy: in simulation the operators' channel is the variable

            fix += (f" (the simulated nodes' node config is the {POLICY_ENV} environment variable of this command, "
                    f"e.g. {POLICY_ENV}='dphype-max-epsilon=2 dphype-min-clients=5')")
        raise RunFailedError(f"the Flower run failed: {cause}{fix}")
    return outcome


def render(result: dict[str, Any]) -> str:
    """The outcome as one line (the app's own output is in the log above it): the run folder's, or Flower's."""
    if "folder" in result:
        return f"run {result['run_id']} {result['status']} in {result['seconds']:.0f} s: {result['folder']}"
    nodes = f"{result['clients']} voters" + (f" and {result['tallies']} tally nodes" if result["tallies"] else "")
    return f"run {result['run_id']} {result['status']} in {result['seconds']:.0f} s on {nodes} (app: {result['app']})"
