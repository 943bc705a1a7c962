"""The API reference: `make docs` (docs/build.py, pdoc) renders every public module, offline, with the Google-style
sections of the docstrings."""

from __future__ import annotations

import importlib.util
import re
import warnings

from helpers import REPO as ROOT


def _build_module():
    spec = importlib.util.spec_from_file_location("dphype_docs_build", ROOT / "docs" / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reference_builds_with_rendered_sections(tmp_path):
    build = _build_module()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = build.build(tmp_path / "docs")
    # pdoc warns (and leaves a page out) when a module fails to import or is reached twice
    assert not [w for w in caught if "pdoc" in w.filename], [str(w.message) for w in caught if "pdoc" in w.filename]

    # the package pages and one page per module, those of the lazily re-exported packages (dphype.flower) too
    for page in ("index.html", "dphype.html", "dphype/flower.html", "dphype/cli.html",
                 "dphype/privacy/accounting.html", "dphype/secure/secagg.html"):
        assert (out / page).is_file(), page
    assert list((out / "dphype" / "flower").glob("*.html"))
    # internal modules stay out
    assert not (out / "dphype" / "_exports.html").exists()

    # a converted docstring's Args/Returns sections are rendered as headed lists
    html = (out / "dphype" / "plotting.html").read_text()
    section = html[html.index('id="save_figure"'):]
    assert "Arguments:" in section and "<li><strong>dpi:</strong>" in section
    assert "Returns:" in section


def test_module_specs_reach_the_lazily_exported_modules():
    specs = _build_module().module_specs()
    assert specs[0] == "dphype" and specs[-1].startswith("!")
    assert any(name.startswith("dphype.flower.") for name in specs)  # dphype.flower's __all__ hides them
    assert not any(name.rpartition(".")[2].startswith("_") for name in specs[:-1])


#: Where the project's history stays out: the code, its tests and benchmarks, the operators' scripts, the docs and the
#: benchmark results.
HISTORY_FREE = ("dphype", "tests", "simulations", "docs", "server", "clients", "results")


def test_no_tracker_numbers_in_the_code_or_the_docs():
    pattern = re.compile(r"\b[Ii]ssues? \d+")
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for folder in HISTORY_FREE for path in sorted((ROOT / folder).rglob("*"))
             if path.suffix in {".py", ".md", ".sh", ".tmpl", ".toml"} and path.is_file()
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert not found, "docstrings and docs are contracts, not history; name the behaviour, not the ticket:\n" + \
        "\n".join(found)
