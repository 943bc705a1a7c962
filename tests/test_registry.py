"""One registry type for every family of named variants: taken names and unknown names are refused alike."""

from __future__ import annotations

import pytest

from dphype.ml.data import dataset_spec
from dphype.ml.oracles import make_problem
from dphype.privacy.noise_kinds import noise_kind
from dphype.registry import Registry
from dphype.release import release_mode
from dphype.selection.rules import selection_rule


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
    assert colours.items() == (("red", 1), ("blue", 2))


def test_a_lookup_may_keep_some_variants_and_refuses_the_others_as_unknown():
    """A view of the registry (the share noise kinds among all kinds): the others are refused and not listed."""
    numbers = Registry[int]("number", "number")
    for name, value in (("one", 1), ("two", 2), ("three", 3)):
        numbers.add(name, value)
    odd = lambda n: n % 2 == 1  # noqa: E731
    assert numbers.get("three", keep=odd) == 3 and numbers.get("two") == 2
    with pytest.raises(ValueError, match=r"^number must be one of one, three, got 'two'$"):
        numbers.get("two", keep=odd)


def test_a_registrys_fix_follows_its_refusal():
    sizes = Registry[int]("size", "size", "set --size to one of them")
    sizes.add("small", 1)
    with pytest.raises(ValueError, match=r"^size must be one of small, got 'huge': set --size to one of them$"):
        sizes.get("huge")
    assert sizes.copy().fix == sizes.fix


@pytest.mark.parametrize(("lookup", "parameter"), [(noise_kind, "noise"), (selection_rule, "rule"),
                                                   (dataset_spec, "dataset"), (release_mode, "release"),
                                                   (make_problem, "oracle")])
def test_every_family_of_variants_refuses_an_unknown_name_through_its_registry(lookup, parameter):
    with pytest.raises(ValueError, match=rf"^{parameter} must be one of \S+(, \S+)*, got 'nope'"):
        lookup("nope")
