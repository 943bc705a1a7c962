"""MkDocs hook of the documentation site: the benchmark results become its ``results/`` pages.

``results/*.md`` (where the bench commands' runs are written up, one page per topic, ``README.md`` their overview) and
their figures are added as they are, without a copy in docs/.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

#: The repository's results folder (beside docs/) and the files of it that the site shows.
RESULTS = Path(__file__).resolve().parent.parent / "results"
SHOWN = ("*.md", "*.png")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the results pages and their figures under ``results/``."""
    for pattern in SHOWN:
        for path in sorted(RESULTS.glob(pattern)):
            files.append(File.generated(config, f"results/{path.name}", abs_src_path=str(path)))
    return files
