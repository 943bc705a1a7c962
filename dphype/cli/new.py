"""``dphype new APP_DIR``: write a runnable Flower app with DP-Hype, offline, from templates in the package.

The app (``dphype/templates/app``, shipped as package data) is the README's embedding example: a Message-API
``ClientApp`` with a task and its own ``@app.train()``, a ``ServerApp`` that selects with
`dphype.flower.DPHype` and trains with Flower's ``FedAvg`` (any strategy works), and a
``pyproject.toml`` with the run config (`dphype.config.DPHypeConfig.from_run_config`) and the node
policy keys (`dphype.node.policy.POLICY_KEYS`) documented. ``--release`` sets the run config's ``release``:
``argmax`` (default) releases only the winner, computed by 3 tally nodes that the ClientApp's mod
`dphype.flower.simulated_roles` simulates beside the voters and the ServerApp finds with
`dphype.flower.connected_committee`; ``sum`` releases the noisy vote sum over SecAgg+. The same two app files
serve both. It runs as written with ``dphype run`` in the app's folder (`dphype.cli.run`).
"""

from __future__ import annotations

import argparse
import re
from importlib.resources import files
from pathlib import Path
from string import Template
from typing import Any

#: The template's ``k`` per release: the planner's recommendation (`dphype.flower.DPHype.plan`) for the template's 8
#: candidates, 10 clients, epsilon 1 and delta 1e-5 (argmax, with the committee's noise: the moderate scenario's
#: simulated chance of a good pick 0.81 with a top-2 ballot, what the default auto ballot votes here; sum: 0.45, with
#: the planner's warning: the sum release needs more clients or a larger epsilon). tests/cli/test_new.py checks it.
TEMPLATE_K: dict[str, int] = {"argmax": 2, "sum": 1}

#: Template file -> path in the app (``{package}`` is the app's Python package).
FILES: dict[str, str] = {
    "pyproject.toml.tmpl": "pyproject.toml",
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
    parser.add_argument("--release", choices=tuple(TEMPLATE_K), default="argmax",
                        help="the run config's release: argmax (only the winner, from 3 simulated tally nodes; "
                             "default) or sum (the noisy vote sum over SecAgg+)")


def package_name(folder: Path) -> str:
    """A Python package name from the folder's name (``my-app`` -> ``my_app``).

    Args:
        folder: The app's folder.

    Returns:
        The package name (prefixed ``app_`` when it would start with a digit).

    Raises:
        ValueError: If the folder's name has no letter or digit.
    """
    name = re.sub(r"\W+", "_", folder.name.lower()).strip("_")
    if not name:
        raise ValueError(f"app_dir must end in a name with a letter or digit, got {str(folder)!r}")
    return f"app_{name}" if name[0].isdigit() else name


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Write the app; refuses a folder that exists and is not empty (nothing is overwritten).

    Args:
        args: The parsed options (``app_dir``, ``release``).

    Returns:
        The ``app`` folder, the ``files`` written (relative to it) and the ``next`` command to run it.

    Raises:
        ValueError: If ``app_dir`` exists and is not an empty folder, or its name makes no package name.
    """
    from dphype import __version__
    from dphype.node.policy import POLICY_KEYS

    folder = Path(args.app_dir).expanduser().absolute()
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ValueError(f"app_dir {str(folder)!r} exists and is not an empty folder; choose a new one")
    package = package_name(folder)
    keys = "\n".join(f"#   {key} = {default!r}: {meaning}".replace("None", "none") for key, (default, meaning)
                     in POLICY_KEYS.items())
    values = {"project": package.replace("_", "-"), "package": package, "version": __version__, "policy_keys": keys,
              "release": args.release, "k": TEMPLATE_K[args.release]}
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
