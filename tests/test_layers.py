"""The import contracts of pyproject.toml's ``[tool.importlinter]`` (docs/architecture.md): the layers,
no import cycles, Flower only in the adapters and the bundled app, no benchmark driver in the library. ``make lint``
runs them as ``lint-imports``; here they fail the fast suite too."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from helpers import REPO as ROOT


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
