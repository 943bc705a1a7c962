"""The test suite's own layout: the folders mirror the package (plus ``simulations/`` for the bench and
``deployment/`` for the operators' sides, ``flwr run`` and packaging), and no test module imports another: shared
plain code lives in ``helpers.py``, shared fixtures in ``conftest.py`` files."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from helpers import REPO

TESTS = REPO / "tests"
#: Folders of tests/ that are not a subpackage of dphype/.
OUTSIDE_THE_PACKAGE = {"simulations", "deployment"}


def local_names() -> set[str]:
    """Names an import of a module in tests/ would use (every module's file name, ``helpers`` excepted; the
    folders are no packages, so ``import tests...`` is refused too)."""
    return {path.stem for path in TESTS.rglob("*.py")} - {"helpers"} | {"tests"}


def imported_roots(path: Path) -> list[tuple[int, str]]:
    """``(line, first name)`` of every import in ``path`` (inside functions too); relative imports as ``"."``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.lineno, "." if node.level else (node.module or "").split(".")[0]))
    return found


def test_no_test_module_imports_another_or_a_conftest():
    local = local_names()
    bad = [f"{path.relative_to(REPO)}:{line}: imports {root}"
           for path in sorted(TESTS.rglob("*.py")) for line, root in imported_roots(path)
           if root == "." or root in local or root.startswith("test_")]
    assert not bad, "a test module may import only helpers (and dphype, simulations, stdlib, third-party):\n" + \
        "\n".join(bad)


def test_the_folders_mirror_the_package_and_hold_only_test_modules_and_conftests():
    packages = {path.parent.name for path in (REPO / "dphype").glob("*/__init__.py")}
    folders = {path.name for path in TESTS.iterdir() if path.is_dir() and not path.name.startswith((".", "__"))}
    assert folders - OUTSIDE_THE_PACKAGE <= packages, folders - OUTSIDE_THE_PACKAGE - packages
    strays = [str(path.relative_to(TESTS)) for path in TESTS.rglob("*.py")
              if not (path.name.startswith("test_") or path.name == "conftest.py" or path == TESTS / "helpers.py")]
    assert not strays, strays


def test_every_test_that_starts_flwr_run_moves_its_local_superlink_off_the_users_ports(tmp_path):
    """``flwr run`` on its default connection starts (or joins!) Flower's local SuperLink on fixed ports (39091 /
    39093), whatever ``FLWR_HOME`` says: a test module that starts ``flwr run`` must take its environment from
    ``offline_env``, which moves them to free ports (or run apps through ``dphype run`` / ``LocalSuperLink``), so that
    ``make test`` passes while a user's ``flwr run .`` runs beside it."""
    from helpers import LOCAL_SUPERLINK_PORTS, offline_env

    starts = re.compile(r"""["']flwr["']\)?,\s*["']run["']""")
    bad = [str(path.relative_to(REPO)) for path in sorted(TESTS.rglob("test_*.py"))
           if starts.search(text := path.read_text()) and "offline_env(" not in text]
    assert not bad, "these test modules start flwr run without offline_env's free local-SuperLink ports: " + \
        ", ".join(bad)
    env, again = offline_env(tmp_path), offline_env(tmp_path)
    ports = {int(env[name]) for name in LOCAL_SUPERLINK_PORTS}
    assert len(ports) == 2 and not ports & {39091, 39093} and ports != {int(again[n]) for n in LOCAL_SUPERLINK_PORTS}
    assert env["FLWR_HOME"] == str(tmp_path) and not any(key.startswith("DPHYPE_") for key in env)
