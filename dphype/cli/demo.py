"""``dphype demo``: the bundled Flower app on Adult -- DP-Hype's private selection, then FedAvg with the winner.

Runs the bundled app (`dphype.app`, shipped inside the package, so it works from an installed wheel) with
``flwr run`` on a private local simulation SuperLink, through ``dphype run``'s runner (`dphype.cli.run.run_locally`:
a failed run ends with one line naming its cause): every
simulated client scores the candidates on its Adult shard and votes top-k. By default (``--release argmax``,
the release results/releases.md measures closer to Opt) each client seals shares of its ballot to 3
simulated tally nodes (3 more nodes, keys made here, `make_tally_keys`), which open only the
winner's index; with ``--release sum`` SecAgg+ releases the noisy vote sum and the server selects with the
configured rule. Either way Flower's FedAvg then trains the final model.
The app's ``pyproject.toml`` is written to a temporary folder (it names the app's components, `COMPONENTS`:
the command line never imports the app; ``--app DIR`` runs another folder's app instead). The DP-Hype settings are
checked here before Flower starts; the ServerApp checks the rest of its run config before any client works.

Node policy: the demo's user operates every simulated node as well as the server, so the nodes get a policy
that admits exactly the demo's own request, once (`dphype.node.ledger.admitting_policy`, through the
``DPHYPE_NODE_POLICY`` environment variable, the operator's channel in simulation). Their ledgers live in
the private ``FLWR_HOME`` of `dphype.flower.local.LocalSuperLink` and are gone with it: each demo
starts with fresh nodes. A real node keeps its own limits (``--node-config``, `dphype.node.policy`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dphype import __version__
from dphype.checks import check_int, check_positive
from dphype.cli import (
    RunFailedError,
    add_candidates_argument,
    add_privacy_arguments,
    add_selection_arguments,
    privacy_config,
)
from dphype.cli.run import run_locally
from dphype.config import RUN_CONFIG_KEYS
from dphype.ml.reference import candidate_accuracies, majority_of_test_split
from dphype.ml.torch_task import check_candidates
from dphype.node.ledger import admitting_policy
from dphype.node.policy import POLICY_ENV
from dphype.result import FAILURE_FORMAT, RESULT_FORMAT, summarize_run
from dphype.secure.committee import COMMITTEE_SIZE
from dphype.selection.candidates import load_candidates

#: ``--reference`` choices: every candidate's accuracy and the majority class, or the majority class alone.
REFERENCES = ("best", "majority")
#: What the reference point is, in the demo's output.
REFERENCE_NOTE = ("computed by the demo from the test split (its operator's) outside the private protocol; DP-Hype "
                  "released none of it")

#: The Flower components of the bundled app (``[tool.flwr.app.components]``), by name: Flower imports them in the
#: app's processes.
COMPONENTS: dict[str, str] = {"serverapp": "dphype.app.server_app:app", "clientapp": "dphype.app.client_app:app"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``dphype demo``.

    Args:
        parser: The sub-command's parser.
    """
    add_privacy_arguments(parser)
    add_selection_arguments(parser, release="argmax")  # the bundled app's release (docs/deployment.md)
    add_candidates_argument(parser)
    parser.add_argument("--seed", type=int, default=0, help="data partition / model seed (default 0)")
    parser.add_argument("--fedavg-rounds", type=int, default=5, help="FedAvg rounds (default 5)")
    parser.add_argument("--local-epochs", type=int, default=5, help="local epochs (default 5)")
    parser.add_argument("--app", default=None, help="folder of a Flower app to run instead of the bundled one "
                        "(default: the bundled app, dphype.app, from the installed package)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="give up after this many seconds (default 3600)")
    parser.add_argument("--reference", choices=REFERENCES, default="majority",
                        help="the reference point printed beside the pick's accuracy, computed here from the test "
                             "split outside the private protocol: 'majority', the majority class's share (instant); "
                             "'best', also every candidate trained centrally with the same FedAvg on the same "
                             "shards: the best one's accuracy (Opt) and the pick's (minutes: about 2.5 CPU minutes "
                             "for the defaults) (default majority)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Check the settings, run the app, return its summary (selection, privacy report, test accuracy).

    The server's own checks (calibration, secure-sum range, committee, the planner) run before Flower starts;
    in argmax mode the demo makes the simulated committee's keys in a temporary folder.

    Args:
        args: The parsed options.

    Returns:
        The bundled app's run summary (`dphype.app.server_app.run_app`), with the wall ``seconds`` of the run, the
        planner's and the selection's ``warnings``, the ``privacy`` report and, for the bundled app, its
        ``reference`` point (`reference_point`).

    Raises:
        ValueError: For bad input (exit status 2 via `dphype.cli.main`).
        dphype.cli.RunFailedError: If the Flower run ends without a result, with the ServerApp's cause when it
            logged one (exit status 1).
    """  # noqa: DOC502, DOC503
    # lazy import: Flower
    from dphype.flower import DPHype
    from dphype.flower.local import node_config_string
    from dphype.flower.tally_node import TALLY_KEYS_ENV

    candidates = load_candidates(args.candidates)
    config = privacy_config(args, len(candidates))  # first: it needs no training code
    if args.app is None:  # the bundled app's task reads only its own keys: refused here, before any node works

        try:
            check_candidates(candidates)
        except ValueError as err:
            raise ValueError(f"--candidates {args.candidates}: {err}\nThe bundled app's task is that training: "
                             "give candidates with only those keys, e.g. --candidates table3") from None
    with tempfile.TemporaryDirectory(prefix="dphype-demo-") as folder:
        # argmax mode: the demo's user operates the 3 simulated tally nodes too, so it makes their keys here
        committee = config.mode.uses_committee
        tallies = make_tally_keys(Path(folder) / "tallies") if committee else ()
        # the server's own checks (calibration, secure-sum range, committee, the planner), before Flower starts
        selection = DPHype(candidates, config, tallies=tallies)
        env = {POLICY_ENV: node_config_string(admitting_policy(selection.request))}
        if tallies:
            env[TALLY_KEYS_ENV] = str(Path(folder) / "tallies")
        return _run(args, selection, env, Path(folder))


def make_tally_keys(folder: Path) -> tuple[bytes, ...]:
    """Create the simulated committee's ``tally-<j>.key`` files in ``folder``; their public keys in order."""
    # lazy import: Flower
    from dphype.flower.tally_node import load_tally_key

    return tuple(load_tally_key(folder / f"tally-{j}.key").public for j in range(COMMITTEE_SIZE))


def _run(args: argparse.Namespace, selection: Any, env: dict[str, str], folder: Path) -> dict[str, Any]:
    """Check the app's own settings, run the app on ``clients`` (plus 3 tally) simulated nodes."""
    # lazy import: Flower
    from dphype.flower.local import is_flower_app

    config = selection.config
    for name in ("fedavg_rounds", "local_epochs"):
        check_int(name.replace("_", "-"), getattr(args, name), 1)
    check_int("seed", args.seed, 0)
    check_positive("timeout", args.timeout)
    if args.app is not None and not is_flower_app(args.app):
        raise ValueError(f"--app {args.app!r} holds no Flower app (a pyproject.toml with [tool.flwr.app]); leave "
                         "--app out to run the bundled app")
    selection.plan()  # refuses below min_success; about a second of simulation: after the instant checks
    result_file = folder / "result.json"
    run_config = {
        **{key: getattr(config, name) for name, key in RUN_CONFIG_KEYS.items()},
        "dataset": "adult", "candidates": args.candidates, "seed": args.seed,
        "fedavg-rounds": args.fedavg_rounds, "local-epochs": args.local_epochs, "result-file": str(result_file),
    }
    app = args.app if args.app is not None else bundled_app(folder / "app", run_config)
    start = time.perf_counter()
    supernodes = config.mode.supernodes(config.clients)
    try:
        run_locally(Path(app), run_config, supernodes, env=env, json=args.json, timeout=args.timeout)
    except RunFailedError:
        failure = json.loads(result_file.read_text()) if result_file.exists() else {}
        if failure.get("format") == FAILURE_FORMAT:  # the ServerApp's own record of why it failed
            raise RunFailedError(f"the run failed: {failure['error']}") from None
        raise
    summary = json.loads(result_file.read_text()) if result_file.exists() else {}
    if summary.get("format") != RESULT_FORMAT:
        raise RunFailedError(f"the run wrote no summary to the run config's result-file: leave --app out\n"
                             f"the app in {app} is not the bundled app's kind")
    seconds = time.perf_counter() - start
    privacy = summary.pop("privacy")
    if args.app is None:
        summary["reference"] = reference_point(args, selection.candidates, summary["selected_index"])
    return {**summary, "seconds": seconds,
            "warnings": [w for w in [(summary["confidence"] or {}).get("warning")] if w],
            "privacy": privacy}


def reference_point(args: argparse.Namespace, candidates: Any, selected: int) -> dict[str, Any]:
    """What the pick's test accuracy compares with, on the same test split (`dphype.ml.reference`).

    Computed by the demo, whose operator owns the data, outside the private protocol (`REFERENCE_NOTE`): the
    majority class's share of the test split and, with ``--reference best``, every candidate trained centrally
    with the run's FedAvg schedule on the run's shards.

    Args:
        args: The demo's options (clients, seed, FedAvg rounds, local epochs, ``--reference``).
        candidates: The public candidate list.
        selected: The pick's index.

    Returns:
        ``majority_class``; with ``best``, also ``best_candidate`` (its index), ``best_accuracy`` and
        ``pick_accuracy`` (the pick trained the same way); and ``note``.
    """
    reference: dict[str, Any] = {"majority_class": majority_of_test_split("adult")}
    if args.reference == "best":
        print("dphype demo: training every candidate centrally for the reference point (outside the private "
              "protocol)", file=sys.stderr)
        accuracies = candidate_accuracies("adult", args.clients, candidates, rounds=args.fedavg_rounds,
                                          local_epochs=args.local_epochs, seed=args.seed)
        best = int(accuracies.argmax())
        reference.update(best_candidate=best, best_accuracy=float(accuracies[best]),
                         pick_accuracy=float(accuracies[selected]))
    return {**reference, "note": REFERENCE_NOTE}


def bundled_app(folder: Path, run_config: dict[str, Any]) -> Path:
    """Write the bundled app's folder: a ``pyproject.toml`` naming the installed `COMPONENTS` and ``run_config``.

    Args:
        folder: The folder to create (it must not exist).
        run_config: The run config, key -> value.

    Returns:
        ``folder``.
    """
    # lazy import: Flower
    from dphype.flower.local import toml_value

    folder.mkdir(parents=True)
    (folder / "README.md").write_text(f"The bundled DP-Hype app: its code is dphype.app of the installed dphype "
                                      f"{__version__} on every node.\n", encoding="utf-8")
    lines = ["[project]", 'name = "dphype-demo"', f'version = "{__version__}"', "dependencies = []", "",
             "[tool.flwr.app]", 'publisher = "dphype"', 'fab-include = ["README.md"]', "",
             "[tool.flwr.app.components]", *(f"{key} = {toml_value(value)}" for key, value in COMPONENTS.items()),
             "", "[tool.flwr.app.config]", *(f"{key} = {toml_value(value)}" for key, value in run_config.items())]
    (folder / "pyproject.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def render(result: dict[str, Any]) -> str:
    """The demo's summary as text (`dphype.result.summarize_run`)."""
    return summarize_run(result)
