"""One registry type for every family of named variants: taken names and unknown names are refused alike."""

from __future__ import annotations

import pytest

from dphype.registry import Registry


def test_a_registry_keeps_order_refuses_taken_and_unknown_names_and_copies_apart():
    colours = Registry[int]("colour", "colour")
    assert colours.add("red", 1) == 1 and colours.add("blue", 2) == 2
    assert colours.names() == ("red", "blue") and list(colours) == [1, 2] and "red" in colours
    assert colours.get("blue") == 2
    with pytest.raises(ValueError, match=r"colour 'red' is already registered \(1\)"):
        colours.add("red", 3)
    for unknown in ("green", None, 1):
        with pytest.raises(ValueError, match=rf"colour must be one of red, blue, got {unknown!r}"):
            colours.get(unknown)
    twin = colours.copy()
    twin.add("green", 3)
    assert twin.names() == ("red", "blue", "green") and colours.names() == ("red", "blue")
