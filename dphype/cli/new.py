"""``dphype new APP_DIR``: write a runnable Flower app with DP-Hype, offline, from templates in the package.

The app (``dphype/templates/app``, shipped as package data) is the embedding example of docs/embedding.md: a Message-API
``ClientApp`` with a task and its own ``@app.train()``, a ``ServerApp`` that selects with
`dphype.flower.DPHype` and trains with Flower's ``FedAvg`` (any strategy works), and a
``pyproject.toml`` with the run config (`dphype.config.DPHypeConfig.from_run_config`) and the node
policy keys (`dphype.node.policy.POLICY_KEYS`) documented. ``--release`` sets the run config's ``release``:
``argmax`` (default) releases only the winner, computed by 3 tally nodes that the ClientApp's mod
`dphype.flower.simulated_roles` simulates beside the voters and the ServerApp finds with
`dphype.flower.connected_committee`; ``sum`` releases the noisy vote sum over SecAgg+; any registered mode
(`dphype.release.RELEASE_MODES`) may be named. The same two app files serve every mode, and the run config's ``k`` is
the planner's recommendation for the mode, and its ``clients`` at least the planner's smallest federation for
it (`template_plan`). It runs as written with ``dphype run`` in the app's folder
(`dphype.cli.run`).
"""

from __future__ import annotations

import argparse
import re
from importlib.resources import files
from pathlib import Path
from string import Template
from typing import Any

from dphype import __version__
from dphype.config import DPHypeConfig
from dphype.node.policy import POLICY_KEYS
from dphype.release import RELEASE_MODES
from dphype.selection.candidates import candidate_grid
from dphype.selection.forecasts import Forecast
from dphype.selection.planner import WARN_BELOW, plan

#: The template app's candidate list (its ``server_app.py``), as `dphype.selection.candidates.candidate_grid`'s
#: keyword arguments.
TEMPLATE_GRID: dict[str, list[float]] = {"lr": [0.001, 0.01, 0.1, 1.0], "steps": [5, 50]}

#: The template's run config (its ``pyproject.toml``) that the planner reads to choose its ``k`` (`template_plan`).
TEMPLATE_RUN: dict[str, Any] = {"epsilon": 1.0, "delta": 1e-5, "clients": 10}

#: The template's ``min-success``: the planner's warning threshold (a federation below it is refused).
TEMPLATE_MIN_SUCCESS: float = WARN_BELOW

#: The ``k`` the planner compares for the template's 8 candidates.
TEMPLATE_KS: tuple[int, ...] = (1, 2, 3, 4)

#: Template file -> path in the app (``{package}`` is the app's Python package).
FILES: dict[str, str] = {
    "pyproject.toml.tmpl": "pyproject.toml",
    "README.md.tmpl": "README.md",
    "gitignore.tmpl": ".gitignore",
    "__init__.py.tmpl": "{package}/__init__.py",
    "client_app.py.tmpl": "{package}/client_app.py",
    "server_app.py.tmpl": "{package}/server_app.py",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``dphype new``.

    Args:
        parser: The sub-command's parser.
    """
    parser.add_argument("app_dir", help="folder to create (must not exist, or be empty); its name names the app")

    parser.add_argument("--release", choices=RELEASE_MODES.names(), default="argmax",
                        help="the run config's release: " + "; ".join(f"{name} ({mode.released})"
                                                                       for name, mode in RELEASE_MODES.items())
                             + "; default argmax (a committee's 3 tally nodes are simulated beside the voters); the "
                               "app's k is the planner's recommendation for the release")


def package_name(folder: Path) -> str:
    """A package name from the folder's (``my-app`` -> ``my_app``, ``app_`` before a digit); else `ValueError`."""
    name = re.sub(r"\W+", "_", folder.name.lower()).strip("_")
    if not name:
        raise ValueError(f"app_dir must end in a name with a letter or digit, got {str(folder)!r}")
    return f"app_{name}" if name[0].isdigit() else name


def template_plan(release: str) -> tuple[int, int]:
    """The planner's ``k`` and number of clients for the template app under ``release``.

    ``k`` is the recommended top-k ``k`` (`dphype.selection.planner.plan`) for `TEMPLATE_GRID` and `TEMPLATE_RUN`
    in the moderate scenario, among `TEMPLATE_KS`; the clients are `TEMPLATE_RUN`'s, or, where the scenario gives
    them less than `TEMPLATE_MIN_SUCCESS` at that ``k``, the planner's smallest federation that reaches it (the app
    would refuse a smaller one).

    Args:
        release: The release mode's name.

    Returns:
        ``(k, clients)``.

    Raises:
        ValueError: For a name that is no registered mode (`dphype.release.release_mode`).
    """  # noqa: DOC502
    cfg = DPHypeConfig(**TEMPLATE_RUN, k=1, release=release, ballot="top-k")
    candidates = candidate_grid(**TEMPLATE_GRID)
    # a winner forecast's k does not depend on the server's rule: planning it with argmax spares the GP's torch import
    rule = "max-votes" if cfg.mode.forecast is Forecast.WINNER else cfg.rule
    chosen = plan(cfg.clients, cfg.epsilon, cfg.delta, candidates.feature_space(), len(candidates), dropout=cfg.dropout,
                  rule=rule, noise=cfg.noise, accountant=cfg.accountant, neighbouring=cfg.neighbouring,
                  ks=TEMPLATE_KS, release=cfg.mode, target=TEMPLATE_MIN_SUCCESS)
    if chosen.success >= TEMPLATE_MIN_SUCCESS or chosen.min_clients is None:
        return chosen.k, cfg.clients
    return chosen.k, max(cfg.clients, chosen.min_clients)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Write the app; refuses a folder that exists and is not empty (nothing is overwritten).

    Args:
        args: The parsed options (``app_dir``, ``release``).

    Returns:
        The ``app`` folder, the ``files`` written (relative to it) and the ``next`` command to run it.

    Raises:
        ValueError: If ``app_dir`` exists and is not an empty folder, or its name makes no package name.
    """
    folder = Path(args.app_dir).expanduser().absolute()
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ValueError(f"app_dir {str(folder)!r} exists and is not an empty folder; choose a new one")
    package = package_name(folder)
    k, clients = template_plan(args.release)
    keys = "\n".join(f"#   {key} = {default!r}: {meaning}".replace("None", "none") for key, (default, meaning)
                     in POLICY_KEYS.items())
    values = {"project": package.replace("_", "-"), "package": package, "version": __version__, "policy_keys": keys,
              "release": args.release, "k": k, "clients": clients, "min_success": TEMPLATE_MIN_SUCCESS,
              "clients_note": "the planner's smallest federation for this release at epsilon 1, min-success "
                              f"{TEMPLATE_MIN_SUCCESS:g}" if clients > TEMPLATE_RUN["clients"] else
                              "the default; the planner's check below says whether it is enough",
              "grid": ", ".join(f"{key}={values!r}" for key, values in TEMPLATE_GRID.items())}
    templates = files("dphype") / "templates" / "app"
    written = []
    for template, target in FILES.items():
        path = folder / target.format(package=package)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(Template((templates / template).read_text(encoding="utf-8")).substitute(values),
                        encoding="utf-8")
        written.append(str(path.relative_to(folder)))
    return {"app": str(folder), "files": written, "release": args.release,
            "next": f"cd {folder} && dphype run"}
