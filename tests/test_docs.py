"""The documentation: the README (the front door) and the site `make docs` builds (mkdocs.yml: the guides in docs/,
the benchmark results, the API reference). The site builds offline with every link and anchor checked; every shell
and Python block of the README and the guides is one that a test runs as written; neither carries tracker numbers."""

from __future__ import annotations

import ast
import io
import os
import re
import subprocess
import sys
import tokenize
import tomllib
from pathlib import Path

import pytest
from helpers import REPO as ROOT
from helpers import doc_blocks
from markdown.extensions.toc import slugify

#: The pages: the README and every page of the site.
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]

#: The sections whose shell and Python blocks are run as written, how many each holds, and the test that runs them.
#: A block elsewhere must repeat one of these verbatim (docs/getting-started.md repeats the README's).
RUN_AS_WRITTEN = {
    ("README.md", "Set-up", "bash"): 1,  # test_the_set_up_block_names_the_makefile_and_its_environment, below
    ("README.md", "A first app", "bash"): 1,  # tests/cli/test_run.py
    ("docs/getting-started.md", "Measure k on data like yours", "bash"): 1,  # tests/cli/test_bench.py
    ("docs/embedding.md", "Add DP-Hype to your Flower app", "python"): 2,  # tests/test_readme_app.py, in process
    ("docs/embedding.md", "Add DP-Hype to your Flower app", "bash"): 1,  # tests/test_readme_app.py, dphype run
    ("docs/embedding.md", "Private final training (optional)", "python"): 1,  # tests/test_readme_app.py
    ("docs/deployment.md", "Deploying the bundled app", "bash"): 2,  # tests/deployment/test_readme_deployment.py
}
#: What a fenced block may be: runnable (`RUNNABLE`), a file's contents or a synopsis and diagram (never run).
RUNNABLE = ("bash", "python")
LANGUAGES = {*RUNNABLE, "toml", "text"}


def fences(page: str) -> list[tuple[str, str]]:
    """Every fenced block of ``page``: its language (``""`` when none is named) and its text."""
    text = (ROOT / page).read_text(encoding="utf-8")
    return re.findall(r"^```(\S*)\n(.*?)^```", text, re.S | re.M)


def test_the_tested_sections_hold_the_blocks_their_tests_run():
    found = {key: len(doc_blocks(*key)) for key in RUN_AS_WRITTEN}
    assert found == RUN_AS_WRITTEN


def test_every_shell_and_python_block_is_one_a_test_runs():
    """A new ```bash or ```python block needs a test that runs it (a synopsis or a diagram is a ```text block), and
    no block hides from this check under another name (```sh, ```console, no language)."""
    tested = {block for key in RUN_AS_WRITTEN for block in doc_blocks(*key)}
    for page in PAGES:
        for language, block in fences(page):
            assert language in LANGUAGES, f"{page}: a ```{language} block (name one of {sorted(LANGUAGES)})"
            if language in RUNNABLE:
                assert block in tested, f"{page}: a ```{language} block no test runs:\n{block}"


def test_the_set_up_block_names_the_makefile_and_its_environment():
    """The README's set-up block: its `make` targets are the Makefile's, and the script it activates is the one
    the Makefile's environment has, whose `bin` holds the `dphype` command the first app runs."""
    (block,) = doc_blocks("README.md", "Set-up", "bash")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z-]+):", makefile, re.M))
    venv = re.search(r"^VENV\s+\?=\s+(\S+)$", makefile, re.M)
    assert venv is not None
    commands = [line.split("#")[0].strip() for line in block.splitlines()]
    assert commands == ["make demo", "make test", f". {venv.group(1)}/bin/activate"]
    assert {"demo", "test"} <= targets
    assert re.search(r"test -x \$\(PY\) \|\| python3 -m venv \$\(VENV\)", makefile)  # venv writes bin/activate
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert "dphype" in project["scripts"]


def test_the_readme_is_a_front_door_whose_links_resolve():
    """At most about 250 lines; every relative link names a file of the repository and, with an anchor, a heading
    of that page (GitHub's view of the README; the site checks its own pages when it builds)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    links = re.findall(r"\]\(([^)#]+)(?:#([^)]+))?\)", text)
    assert links
    for target, anchor in links:
        if target.startswith("https://"):
            continue
        path = ROOT / target
        assert path.is_file(), target
        if anchor:
            headings = re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.M)
            assert anchor in {slugify(heading, "-") for heading in headings}, f"{target}#{anchor}"


def test_every_page_is_in_the_site_navigation():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in PAGES[1:]:
        assert f" {Path(page).relative_to('docs')}\n" in nav, page


@pytest.mark.slow
def test_the_site_builds_offline_with_every_link_checked(tmp_path):
    """`mkdocs build --strict` (what `make docs` runs) with the network unreachable: no warning (a link to a missing
    page or anchor is one, mkdocs.yml's `validation`), every page and the API reference rendered, the results page
    and its figures there, and no page loading anything from another host (no web fonts, no CDN)."""
    site = tmp_path / "site"
    dead = "http://127.0.0.1:9"  # nothing listens on the discard port
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1", "HTTP_PROXY": dead, "HTTPS_PROXY": dead,
           "http_proxy": dead, "https_proxy": dead, "NO_PROXY": "", "no_proxy": ""}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "WARNING" not in done.stderr, done.stderr[-4000:]

    for page in PAGES[1:]:
        assert (site / Path(page).relative_to("docs").with_suffix(".html")).is_file(), page
    assert (site / "results" / "index.html").is_file() and list((site / "results").glob("*.png"))
    for page in (ROOT / "results").glob("*.md"):
        assert (site / "results" / ("index.html" if page.name == "README.md" else f"{page.stem}.html")).is_file()
    assert (site / "flow.svg").is_file() and 'src="flow.svg"' in (site / "index.html").read_text(encoding="utf-8")
    flower = (site / "reference" / "flower.html").read_text(encoding="utf-8")
    assert 'id="dphype.flower.register_dphype"' in flower and "Parameters:" in flower
    remote = re.compile(r"<(?:link|script|img)\b[^>]*\b(?:href|src)=\"(?:https?:)?//", re.I)
    for html in site.rglob("*.html"):
        assert not remote.search(html.read_text(encoding="utf-8")), html.relative_to(site)


#: A measured figure in prose: a time (`41.1 s`, `2.00-2.10 CPU s`, `25.0 / 21.9 s`) unless it is a setting (`every
#: 3 s`, `sleeps 3 s`, `default 600 s`, `goal 60 s`), a machine's load, a confidence interval, or a gap to Opt (a goal
#: says `within 2 points of Opt`).
MEASURED = re.compile(
    r"(?<![\w.])(?<!every )(?<!sleeps )(?<!default )(?<!goal )"
    r"\d+(?:[.,]\d+)?(?:\s?[-/]\s?\d+(?:\.\d+)?)*\s(?:CPU\s)?(?:s|ms|seconds|minutes|hours)\b(?!-)"
    r"|load averages?\s(?:of\s|at\s|about\s)?\d+(?:\.\d+)?"
    r"|(?<![\w.])\d+(?:\.\d+)?\s±\s\d+(?:\.\d+)?"
    r"|(?<!within )(?<!most )\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?\spoints?\s(?:from|behind|below)\sOpt")


def measured_figures(markdown: str) -> list[str]:
    """The measured figures in the prose of ``markdown`` (fenced blocks and code spans left out), as written."""
    blanked = re.sub(r"^```.*?^```", lambda block: "\n" * block.group().count("\n"), markdown, flags=re.S | re.M)
    return [" ".join(m.group().split()) for m in MEASURED.finditer(re.sub(r"`[^`\n]*`", "``", blanked))]


def test_measured_figures_are_spotted_and_settings_are_not():
    assert measured_figures("selection 40.8 / 41.1 s (goal 60 s), 2.00-2.10 CPU s, load average 6.8") == [
        "40.8 / 41.1 s", "2.00-2.10 CPU s", "load average 6.8"]
    assert measured_figures("0.35 ± 0.04 points; lands 12.0 points from Opt; about 2.5 CPU\nminutes") == [
        "0.35 ± 0.04", "12.0 points from Opt", "2.5 CPU minutes"]
    assert measured_figures("polls every 0.5 s, sleeps 3 s (default 600 s; goal 30 s), within 2 points of Opt, "
                            "`--idle 30 s`\n```text\n4.2 s\n```\nthe 3-5 messages, a 64-byte signature") == []


def test_the_results_are_pages_by_topic_each_with_its_figures_and_commands():
    """results/README.md is the overview of one page per topic; every committed figure is shown on a results page,
    every figure a page shows is there, and every topic page names the commands that made its numbers."""
    results = ROOT / "results"
    pages = {page.name: page.read_text(encoding="utf-8") for page in sorted(results.glob("*.md"))}
    overview = pages.pop("README.md")
    assert len(pages) >= 5 and all(f"]({name})" in overview for name in pages), sorted(pages)
    shown = {name for text in pages.values() for name in re.findall(r"!\[[^\]]*\]\(([^)#]+\.png)\)", text)}
    assert shown == {png.name for png in results.glob("*.png")}
    for name, text in pages.items():
        assert re.search(r"(dphype bench|python -m simulations)", text), f"{name} names no command"
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert all(f"results/{name}" in nav for name in [*pages, "README.md"])


def test_the_front_page_shows_the_flow_diagram_its_script_draws():
    """docs/index.md shows docs/flow.svg, which docs/flow_diagram.py writes (text kept as text, one stage per box)."""
    assert "](flow.svg)" in (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    svg = (ROOT / "docs" / "flow.svg").read_text(encoding="utf-8")
    for stage in ("Server", "Voters", "tallies", "Winner", "Final training", "Evaluation"):
        assert stage in svg, stage
    assert "flow.svg" in (ROOT / "docs" / "flow_diagram.py").read_text(encoding="utf-8")


def test_the_guides_quote_no_measured_figure():
    """Measured results live in the file the benchmark commands' runs are written up in (results/*.md, the site's
    results pages), each beside its command and the machine's load; the README and the guides link to them."""
    found = [f"{page}: {figure}" for page in PAGES
             for figure in measured_figures((ROOT / page).read_text(encoding="utf-8"))]
    assert not found, "measured figures belong in results/*.md, beside their command; link there:\n" + \
        "\n".join(found)


#: Where the project's history stays out: the code, its tests and benchmarks, the operators' scripts, the README,
#: the docs and the benchmark results.
HISTORY_FREE = ("dphype", "tests", "simulations", "docs", "server", "clients", "results", "README.md")


def test_no_tracker_numbers_in_the_code_or_the_docs():
    pattern = re.compile(r"(?<!Flower )\b[Ii]ssues?[ _]#?\d+")  # an upstream ticket may be cited by project
    paths = [path for entry in HISTORY_FREE for path in ([ROOT / entry] if (ROOT / entry).is_file()
                                                          else sorted((ROOT / entry).rglob("*")))]
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}" for path in paths
             if path.suffix in {".py", ".md", ".sh", ".tmpl", ".toml"} and path.is_file()
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert not found, "docstrings and docs are contracts, not history; name the behaviour, not the ticket:\n" + \
        "\n".join(found)


def _docstring_and_code_lines(source: str) -> tuple[int, int]:
    """Non-blank docstring lines and the other non-blank, non-comment lines of one module."""
    lines = source.splitlines()
    documented: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value,
                                                                                                   str):
                documented.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    comments = {token.start[0] for token in tokenize.generate_tokens(io.StringIO(source).readline)
                if token.type == tokenize.COMMENT and token.line.lstrip().startswith("#")}
    doc = sum(1 for number in documented if lines[number - 1].strip())
    code = sum(1 for number, line in enumerate(lines, 1)
               if line.strip() and number not in documented and number not in comments)
    return doc, code


def test_the_package_reads_more_code_than_docstring():
    """Docstrings are contracts: at most three docstring lines per four lines of code across ``dphype/``."""
    counts = [_docstring_and_code_lines(path.read_text(encoding="utf-8"))
              for path in sorted((ROOT / "dphype").rglob("*.py"))]
    doc, code = sum(d for d, _ in counts), sum(c for _, c in counts)
    assert doc <= 0.75 * code, f"{doc} docstring lines against {code} lines of code ({doc / code:.2f} > 0.75)"
