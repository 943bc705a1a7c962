"""Lazy re-exports (PEP 562) for `dphype` and `dphype.flower`.

A public name is imported from its home module on first use, so a process that needs one part (a ClientApp serving
a protocol stage) does not import the rest (torch, scipy's solvers, Flower's server side).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_getattr(package: str, exports: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], object]:
    """The module-level ``__getattr__`` of ``package``: imports a name once, caches it in ``namespace``.

    Args:
        package: The package's dotted name (for the error message).
        exports: Each public name -> the dotted name of its home module.
        namespace: The package's ``globals()``.

    Returns:
        The ``__getattr__(name)``; it raises ``AttributeError`` for a name not in ``exports``.
    """

    def __getattr__(name: str) -> object:
        if name in exports:
            value = getattr(import_module(exports[name]), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
