"""Build dphype's HTML API reference with pdoc, offline: ``python docs/build.py [OUTPUT]`` (default ``build/docs``).

The reference covers the installed library: ``dphype`` and every public module of its subpackages (the Flower
adapters, the bundled app and the command line included); a module or package whose name starts with ``_`` is
internal and left out, and so are ``tests/`` and ``simulations/``. Docstrings are Google style (``Args:``,
``Returns:``, ``Raises:``), rendered as markdown.
"""

from __future__ import annotations

import pkgutil
import sys
from pathlib import Path

#: Where ``make docs`` writes the reference (git-ignored, like the rest of ``build/``).
DEFAULT_OUTPUT = Path("build/docs")


def module_specs() -> list[str]:
    """The module specifications to hand to pdoc.

    pdoc walks a package's submodules itself, except where the package's ``__all__`` (``dphype``,
    ``dphype.flower``: their lazy re-exports) leaves them out; those submodules are named here one by one.

    Returns:
        ``"dphype"``, the public submodules that pdoc would not reach from it, and a last exclusion pattern
        (``!...``) for internal modules (a ``_`` name at any depth).
    """
    import dphype

    specs = ["dphype"]
    for info in pkgutil.walk_packages(dphype.__path__, "dphype."):
        parent, _, name = info.name.rpartition(".")
        if not name.startswith("_") and hasattr(sys.modules[parent], "__all__"):
            specs.append(info.name)
    return [*specs, r"!(.*\.)?_[^.]*$"]


def build(output: Path = DEFAULT_OUTPUT) -> Path:
    """Render the reference as HTML.

    Args:
        output: The folder to write into (created when missing); one page per module, at
            ``output/dphype/<subpackage>/<module>.html``, plus ``index.html`` and the search index.

    Returns:
        The folder written, ``output``.
    """
    import pdoc
    import pdoc.render

    pdoc.render.configure(docformat="google", show_source=True, search=True)
    pdoc.pdoc(*module_specs(), output_directory=output)
    return output


if __name__ == "__main__":
    print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUTPUT))
