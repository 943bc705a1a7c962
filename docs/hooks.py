"""MkDocs hook of the documentation site: the benchmark results become its ``results/`` page.

``results/README.md`` (where the bench commands' runs are written up) and its figures are added as they are, without
a copy in docs/.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

#: The repository's results folder (beside docs/) and the files of it that the site shows.
RESULTS = Path(__file__).resolve().parent.parent / "results"
SHOWN = ("README.md", "*.png")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the results page and its figures under ``results/``."""
    for pattern in SHOWN:
        for path in sorted(RESULTS.glob(pattern)):
            files.append(File.generated(config, f"results/{path.name}", abs_src_path=str(path)))
    return files
