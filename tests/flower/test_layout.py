"""The layout of dphype.flower: no module imports a private name of another, no import cycle among them (imports
inside functions and under TYPE_CHECKING count), every wire name spelled only in dphype.flower.wire, and no
deprecated path left for a moved name."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import dphype.flower
from dphype.flower import wire

PACKAGE = "dphype.flower"
ROOT = Path(dphype.flower.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join((PACKAGE, *parts[:-1])) if parts[-1] == "__init__" else ".".join((PACKAGE, *parts))


MODULES = {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def imports(module: str) -> list[tuple[str, str | None, int]]:
    """``(imported module, name imported from it or None, line)`` for every import statement of ``module``,
    wherever it is (module level, functions, ``if TYPE_CHECKING``); ``from m import sub`` of a submodule
    counts as an import of ``m.sub``."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[tuple[str, str | None, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.extend((alias.name, None, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.append((sub, None, node.lineno) if sub in MODULES else (base, alias.name, node.lineno))
    return out


def private(name: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in name.split("."))


def test_the_layout_sees_every_module():
    assert {"dphype.flower.wire", "dphype.flower.grid", "dphype.flower.tally_node", "dphype.flower.client",
            "dphype.flower.client.policy_client", "dphype.flower.client.secagg_client",
            "dphype.flower.client.committee_client",
            "dphype.flower.server", "dphype.flower.server.readiness", "dphype.flower.server.secagg_server",
            "dphype.flower.server.committee_server"} <= set(MODULES)
    # the parser sees imports under TYPE_CHECKING and inside functions
    assert "dphype.flower.client" in {target for target, _, _ in imports("dphype.flower")}
    assert "tomllib" in {target for target, _, _ in imports("dphype.flower.local")}  # in is_flower_app


def test_no_module_imports_a_private_name_of_another():
    offences = []
    for module in MODULES:
        for target, name, line in imports(module):
            if not target.startswith(PACKAGE) or target == module:
                continue
            if private(target) or (name is not None and private(name)):
                offences.append(f"{module}:{line} imports {target}{'' if name is None else '.' + name}")
    assert not offences, offences


def test_no_private_attribute_of_another_flower_module_is_used():
    """``import dphype.flower.x as m`` then ``m._y`` is a private import too."""
    offences = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        aliases = {alias.asname or alias.name: alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                   for alias in node.names if alias.name.startswith(PACKAGE)}
        aliases.update({alias.asname or alias.name: target for node in ast.walk(tree)
                        if isinstance(node, ast.ImportFrom) for alias in node.names
                        if (target := f"{node.module}.{alias.name}") in MODULES})
        offences += [f"{module}:{node.lineno} uses {node.value.id}.{node.attr}" for node in ast.walk(tree)
                     if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                     and node.value.id in aliases and private(node.attr)]
    assert not offences, offences


def test_the_flower_modules_import_each_other_without_a_cycle():
    graph = {module: sorted({target for target, _, _ in imports(module) if target in MODULES and target != module})
             for module in MODULES}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        if module in path:
            cycle = path[path.index(module):] + (module,)
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        for target in graph[module]:
            visit(target, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())


def test_the_client_side_imports_nothing_of_the_server_side():
    """A ClientApp process loads the client handlers without the server (dphype.flower's lazy exports)."""
    reached, todo = set(), ["dphype.flower.client"]
    while todo:
        module = todo.pop()
        if module in reached:
            continue
        reached.add(module)
        todo += [target for target, _, _ in imports(module) if target in MODULES]
    assert not {m for m in reached if m.startswith("dphype.flower.server")}, reached


def test_every_wire_name_is_spelled_in_the_wire_module_only():
    values = {value for name, value in vars(wire).items() if name.isupper() and isinstance(value, str)}
    spelled = [f"{module}:{node.lineno} {node.value!r}" for module, path in MODULES.items()
               if module != "dphype.flower.wire" for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.Constant) and node.value in values]
    assert not spelled, spelled


@pytest.mark.parametrize(("old", "name"), [("dphype.flower.tally_node", "ClientGrid"),
                                           ("dphype.flower.tally_node", "discover_committee"),
                                           ("dphype.flower", "discover_committee")])  # one finder: connected_committee
def test_a_moved_name_has_no_deprecated_path(old, name):
    assert not hasattr(importlib.import_module(old), name)
    assert "dphype.flower.secagg" not in MODULES  # split into server.secagg_server and client.secagg_client


def test_the_package_exports_what_a_committee_app_needs():
    from dphype.flower.server.committee_server import ClientGrid, connected_committee
    from dphype.flower.tally_node import TALLY_ID, load_tally_key

    assert (dphype.flower.ClientGrid, dphype.flower.connected_committee) == (ClientGrid, connected_committee)
    assert (dphype.flower.TALLY_ID, dphype.flower.load_tally_key) == (TALLY_ID, load_tally_key)
    assert set(dphype.flower.__all__) == set(dphype.flower._EXPORTS)
