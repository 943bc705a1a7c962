"""The import contracts of pyproject.toml's ``[tool.importlinter]`` (docs/architecture.md): the layers,
no import cycles, Flower only in the adapters and the bundled app, no benchmark driver in the library. ``make lint``
runs them as ``lint-imports``; here they fail the fast suite too."""

from __future__ import annotations

import importlib
import os
import pkgutil
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from helpers import REPO as ROOT

from dphype.cli import COMMANDS


def lint_imports(folder: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the checkout in ``folder`` (its pyproject's contracts, its own dphype and simulations)."""
    command = ("import sys; from importlinter.cli import lint_imports; "
               "sys.exit(lint_imports(no_cache=True, no_logo=True))")
    return subprocess.run([sys.executable, "-c", command], cwd=folder, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(folder)})


def test_the_import_contracts_are_kept() -> None:
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 4 kept, 0 broken." in done.stdout


def test_an_upward_import_inside_a_function_breaks_the_layers(tmp_path: Path) -> None:
    """Imports inside functions count (grimp reads every import statement): privacy importing the protocol in a
    function, as a lazy import would, breaks the layers and makes a cycle."""
    for name in ("dphype", "simulations"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "data"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    with open(tmp_path / "dphype" / "privacy" / "noise.py", "a", encoding="utf-8") as fh:
        fh.write("\n\ndef _upward():\n    from dphype.protocol import VoteRequest\n\n    return VoteRequest\n")
    done = lint_imports(tmp_path)
    assert done.returncode == 1
    assert "dphype.privacy is not allowed to import dphype.protocol" in done.stdout
    assert "- dphype.privacy.noise -> dphype.protocol (l." in done.stdout
    assert "Contracts: 2 kept, 2 broken." in done.stdout


def test_each_module_name_is_used_once_but_a_commands_module_is_named_after_its_command() -> None:
    """No two modules (or packages) of dphype share a name, except ``dphype/cli/<command>.py``, named after the
    ``dphype`` command it implements, which may repeat the name of the module it drives (``cli/roster.py``)."""
    package = ROOT / "dphype"
    owners: defaultdict[str, list[str]] = defaultdict(list)
    for path in package.rglob("*.py"):
        module = path.parent if path.name == "__init__.py" else path.with_suffix("")
        if module != package:
            owners[module.name].append(module.relative_to(package).as_posix())
    repeated = {name: paths for name, paths in owners.items()
                if len([p for p in paths if not p.startswith("cli/")]) > 1
                or len(paths) > 1 and COMMANDS.get(name, ("",))[0] != f"dphype.cli.{name}"}
    assert not repeated, f"give these modules distinct names: {repeated}"
    assert "cli/roster" in owners["roster"] and len(owners["roster"]) == 2  # the one allowed kind of repeat


@pytest.mark.parametrize("package", ["dphype", "dphype.flower"])
def test_no_lazily_exported_name_is_the_name_of_a_submodule(package: str) -> None:
    """A package's lazy export (``_EXPORTS``, PEP 562) named like one of its submodules would be shadowed by that
    submodule once anything imports it."""
    module = importlib.import_module(package)
    submodules = {info.name for info in pkgutil.iter_modules(module.__path__)}
    assert not submodules & set(module._EXPORTS), submodules & set(module._EXPORTS)
