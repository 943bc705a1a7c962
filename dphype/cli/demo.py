"""``dphype demo``: the bundled Flower app on Adult -- DP-Hype's private selection, then FedAvg with the winner.

Runs the bundled app (`dphype.app`, shipped inside the package, so it works from an installed wheel) with
``flwr run`` on a private local simulation SuperLink, through ``dphype run``'s runner (`dphype.cli.run.run_locally`:
a failed run ends with one line naming its cause): every
simulated client scores the candidates on its Adult shard and votes top-k. By default (``--release argmax``,
the release results/README.md measures closer to Opt) each client seals shares of its noisy votes to 3
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

from dphype.cli import (
    RunFailed,
    add_candidates_argument,
    add_privacy_arguments,
    add_selection_arguments,
    privacy_config,
)

#: The Flower components of the bundled app (``[tool.flwr.app.components]``), by name: Flower imports them in the
#: app's processes.
COMPONENTS: dict[str, str] = {"serverapp": "dphype.app.server:app", "clientapp": "dphype.app.client:app"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``dphype demo``.

    Args:
        parser: The sub-command's parser.
    """
    add_privacy_arguments(parser)
    add_selection_arguments(parser, release="argmax")  # the release the benchmarks support (README)
    add_candidates_argument(parser)
    parser.add_argument("--seed", type=int, default=0, help="data partition / model seed (default 0)")
    parser.add_argument("--fedavg-rounds", type=int, default=5, help="FedAvg rounds (default 5)")
    parser.add_argument("--local-epochs", type=int, default=5, help="local epochs (default 5)")
    parser.add_argument("--app", default=None, help="folder of a Flower app to run instead of the bundled one "
                        "(default: the bundled app, dphype.app, from the installed package)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="give up after this many seconds (default 3600)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Check the settings, run the app, return its summary (selection, privacy report, test accuracy).

    The server's own checks (calibration, secure-sum range, committee, the planner) run before Flower starts;
    in argmax mode the demo makes the simulated committee's keys in a temporary folder.

    Args:
        args: The parsed options.

    Returns:
        The bundled app's run summary (`dphype.app.server.run_app`), with the wall ``seconds``, the planner's and
        the selection's ``warnings`` and the ``privacy`` report.

    Raises:
        ValueError: For bad input (exit status 2 via `dphype.cli.main`).
        dphype.cli.RunFailed: If the Flower run fails (nothing was released).
    """  # noqa: DOC502
    from dphype.flower import DPHype
    from dphype.flower.local import node_config_string
    from dphype.flower.tally import TALLY_KEYS_ENV
    from dphype.modes import Aggregator
    from dphype.node.ledger import admitting_policy
    from dphype.node.policy import POLICY_ENV
    from dphype.selection.candidates import load_candidates

    candidates = load_candidates(args.candidates)
    config = privacy_config(args, len(candidates))
    with tempfile.TemporaryDirectory(prefix="dphype-demo-") as folder:
        # argmax mode: the demo's user operates the 3 simulated tally nodes too, so it makes their keys here
        committee = config.mode.aggregator is Aggregator.COMMITTEE
        tallies = make_tally_keys(Path(folder) / "tallies") if committee else ()
        # the server's own checks (calibration, secure-sum range, committee, the planner), before Flower starts
        selection = DPHype(candidates, config, tallies=tallies)
        env = {POLICY_ENV: node_config_string(admitting_policy(selection.request))}
        if tallies:
            env[TALLY_KEYS_ENV] = str(Path(folder) / "tallies")
        return _run(args, selection, env, Path(folder))


def make_tally_keys(folder: Path) -> tuple[bytes, ...]:
    """The simulated committee's keys, created in ``folder`` (``tally-<j>.key``).

    The simulated tally nodes read them through `dphype.flower.tally.TALLY_KEYS_ENV`.

    Args:
        folder: Where to create the key files.

    Returns:
        Their X25519 public keys, in committee order.
    """
    from dphype.flower.tally import load_tally_key
    from dphype.secure.tally import COMMITTEE_SIZE

    return tuple(load_tally_key(folder / f"tally-{j}.key").public for j in range(COMMITTEE_SIZE))


def _run(args: argparse.Namespace, selection: Any, env: dict[str, str], folder: Path) -> dict[str, Any]:
    """Check the app's own settings, run the app on ``clients`` (plus 3 tally) simulated nodes."""
    from dphype.checks import check_int, check_positive
    from dphype.cli.run import run_locally
    from dphype.config import RUN_CONFIG_KEYS
    from dphype.flower.local import is_flower_app
    from dphype.modes import Aggregator
    from dphype.secure.tally import COMMITTEE_SIZE

    config = selection.config
    plan = selection.plan()
    for warning in plan.warnings:
        print(f"dphype demo: warning: {warning}", file=sys.stderr)
    for name in ("fedavg_rounds", "local_epochs"):
        check_int(name.replace("_", "-"), getattr(args, name), 1)
    check_int("seed", args.seed, 0)
    check_positive("timeout", args.timeout)
    if args.app is not None and not is_flower_app(args.app):
        raise ValueError(f"--app {args.app!r} holds no Flower app (a pyproject.toml with [tool.flwr.app]); leave "
                         "--app out to run the bundled app")
    result_file = folder / "result.json"
    run_config = {
        **{key: getattr(config, name) for name, key in RUN_CONFIG_KEYS.items()},
        "dataset": "adult", "candidates": args.candidates, "seed": args.seed,
        "fedavg-rounds": args.fedavg_rounds, "local-epochs": args.local_epochs, "result-file": str(result_file),
    }
    app = args.app if args.app is not None else bundled_app(folder / "app", run_config)
    start = time.perf_counter()
    supernodes = config.clients + (COMMITTEE_SIZE if config.mode.aggregator is Aggregator.COMMITTEE else 0)
    run_locally(Path(app), run_config, supernodes, env=env, json=args.json, timeout=args.timeout)
    if not result_file.exists():
        raise RunFailed(f"the run completed without writing its summary to the run config's result-file: the app "
                        f"in {app} is not the bundled app's kind (leave --app out)")
    summary = json.loads(result_file.read_text())
    privacy = summary.pop("privacy")
    return {**summary, "seconds": time.perf_counter() - start,
            "warnings": plan.warnings + [w for w in [(summary["confidence"] or {}).get("warning")] if w],
            "privacy": privacy}


def bundled_app(folder: Path, run_config: dict[str, Any]) -> Path:
    """Write the Flower app folder of the bundled app.

    A ``pyproject.toml`` whose components are the installed `COMPONENTS` and whose run config declares
    ``run_config``'s keys, and the FAB's one file, a note that the app's code is the installed ``dphype``'s
    (every node runs its own copy).

    Args:
        folder: The folder to create (it must not exist).
        run_config: The run config, key -> value.

    Returns:
        ``folder``.
    """
    from dphype import __version__
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
    """The demo's summary as text.

    The selection (`dphype.result.DPHypeResult.summary`), then the training, the whole run's guarantee and the
    test accuracy.

    Args:
        result: `run`'s summary.

    Returns:
        The text.
    """
    from dphype.cli import render_text
    from dphype.result import DPHypeResult

    selection = DPHypeResult.from_dict(result).summary()
    keys = ("training", "run", "accuracy", "test_loss", "predicted_success", "selection_seconds", "fedavg_seconds",
            "seconds", "warnings")
    return selection + "\n" + render_text({key: result[key] for key in keys if key in result})
