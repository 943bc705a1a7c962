"""Named variants of one concept (a noise kind, a selection rule, a data set), in registration order.

Registering refuses a name that is taken; looking a name up refuses an unknown one with the list of registered
names, so a configuration, the command line and a wire message meet the same refusal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> variant, refusing taken and unknown names.

    Args:
        parameter: The parameter a looked-up name is the value of, as errors name it (``"noise"``).
        concept: What is registered, as errors name it (``"noise kind"``).
        fix: How to set the parameter, appended to the refusal of an unknown name (empty: nothing appended).
        renamed: Retired names -> their new names: looking a retired name up is refused, naming the new one.
    """

    def __init__(self, parameter: str, concept: str, fix: str = "", renamed: dict[str, str] | None = None) -> None:
        self.parameter = parameter
        self.concept = concept
        self.fix = fix
        self.renamed = dict(renamed or {})
        self._items: dict[str, T] = {}

    def add(self, name: str, item: T) -> T:
        """Register ``item`` under ``name`` and return it; a taken name is refused."""
        if name in self._items:
            raise ValueError(f"{self.concept} {name!r} is already registered ({self._items[name]!r})")
        self._items[name] = item
        return item

    def get(self, name: Any, keep: Callable[[T], bool] | None = None) -> T:
        """The variant named ``name``; an unknown name is refused with the list of registered ones.

        Args:
            name: The name to look up.
            keep: Where given, only the variants it keeps count: another one is refused, and not listed, as unknown.

        Returns:
            The variant.

        Raises:
            ValueError: ``name`` is unknown (or not kept) or was renamed.
        """
        item = self._items.get(name) if isinstance(name, str) else None
        if item is not None and keep is not None and not keep(item):
            item = None
        if item is None and isinstance(name, str) and name in self.renamed:
            raise ValueError(f"{self.parameter}={name!r} was renamed: set {self.parameter}={self.renamed[name]!r}")
        if item is None:
            fix = f": {self.fix}" if self.fix else ""
            names = [n for n, variant in self._items.items() if keep is None or keep(variant)]
            raise ValueError(f"{self.parameter} must be one of {', '.join(names)}, got {name!r}{fix}")
        return item

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._items)

    def items(self) -> tuple[tuple[str, T], ...]:
        """``(name, variant)`` pairs, in registration order."""
        return tuple(self._items.items())

    def copy(self) -> Registry[T]:
        """A registry with the same entries, for a test's throwaway variants."""
        twin: Registry[T] = Registry(self.parameter, self.concept, self.fix, self.renamed)
        twin._items = dict(self._items)
        return twin

    def __iter__(self) -> Iterator[T]:
        return iter(self._items.values())

    def __contains__(self, name: object) -> bool:
        return name in self._items
