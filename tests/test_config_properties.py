"""Property-based tests (Hypothesis) of the configuration and the run config: any value of any field is either
accepted, and then stored within its documented range, or refused with a ``ValueError`` that names the field --
never another exception type, never a value outside the range."""

from __future__ import annotations

import math
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dphype.checks import MAX_CLIENTS, MAX_EPSILON
from dphype.config import RUN_CONFIG_KEYS, DPHypeConfig

#: The budget of these tests: fast-suite sized (a few seconds in all), no database folder left behind.
FAST = settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

#: Anything a user, a TOML file or a program may hand over.
WILD = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1e9, 1e300, 5e-324, float("nan"), float("inf"), MAX_EPSILON, MAX_EPSILON * (1 + 1e-9),
                     MAX_CLIENTS, MAX_CLIENTS + 1]),
    st.text(max_size=12), st.sampled_from(["1", "auto", "top-k", "rank:3", "score:4:2", "rank:x", "score:", ":"]),
    st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
)
#: Valid values of each field (and near-misses drawn from the wild ones).
VALID = {
    "epsilon": st.floats(min_value=1e-3, max_value=MAX_EPSILON),
    "delta": st.floats(min_value=1e-12, max_value=0.5),
    "k": st.integers(min_value=1, max_value=50),
    "clients": st.integers(min_value=2, max_value=MAX_CLIENTS),
    "dropout": st.floats(min_value=0.0, max_value=0.9),
    "noise": st.sampled_from(["skellam", "gaussian"]),
    "accountant": st.sampled_from([None, "auto", "rdp", "analytic"]),
    "neighbouring": st.sampled_from(["replace-one", "add-remove"]),
    "rule": st.sampled_from(["gp", "max-votes"]),
    "min_success": st.floats(min_value=0.0, max_value=1.0),
    "release": st.sampled_from(["sum", "argmax", "committee-sum"]),
    "ballot": st.sampled_from([None, "default", "auto", "top-k", "rank:3", "score:4"]),
}
FIELDS = tuple(VALID)


@st.composite
def field_values(draw) -> tuple[dict, set[str]]:
    """Every field a valid or a wild value; returns the values and the names of the fields drawn wild."""
    values, wild = {}, set()
    for name in FIELDS:
        if draw(st.integers(0, 5)) == 0:
            values[name] = draw(WILD)
            wild.add(name)
        else:
            values[name] = draw(VALID[name])
    return values, wild


def names_a_field(message: str, names: set[str]) -> bool:
    """Whether ``message`` names one of ``names`` (a field, or its run-config key) as a word."""
    spellings = names | {RUN_CONFIG_KEYS[n] for n in names}
    return any(re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", message) for n in spellings)


def assert_in_range(config: DPHypeConfig) -> None:
    assert 0.0 < config.epsilon <= MAX_EPSILON and math.isfinite(config.epsilon)
    assert 0.0 < config.delta < 1.0
    assert isinstance(config.k, int) and config.k >= 1
    assert 2 <= config.clients <= MAX_CLIENTS
    assert 0.0 <= config.dropout < 1.0
    assert config.accountant in ("rdp", "analytic") and 0.0 <= config.min_success <= 1.0


@FAST
@given(field_values())
def test_a_configuration_is_valid_or_refused_naming_a_bad_field(drawn):
    values, wild = drawn
    try:
        config = DPHypeConfig(**values)
    except ValueError as err:
        # a valid value may be refused in combination (analytic accountant with skellam noise, a graded ballot
        # with the sum release): the message then names one of the fields involved
        assert names_a_field(str(err), wild | {"accountant", "noise", "ballot", "release"}), str(err)
        if not wild:
            assert names_a_field(str(err), {"accountant", "ballot"}), str(err)
        return
    assert_in_range(config)


@FAST
@given(field_values(), st.dictionaries(st.text(max_size=8), WILD, max_size=3))
def test_a_run_config_is_valid_or_refused_naming_a_bad_key(drawn, extra):
    values, wild = drawn
    run_config = {**extra, **{RUN_CONFIG_KEYS[name]: value for name, value in values.items() if value is not None}}
    try:
        config = DPHypeConfig.from_run_config(run_config)
    except ValueError as err:
        missing = str(err).startswith("run config is missing: ")
        assert missing or names_a_field(str(err), wild | {"accountant", "noise", "ballot", "release"}), str(err)
        return
    assert_in_range(config)


@settings(max_examples=100, deadline=None, database=None)
@given(st.one_of(st.floats(min_value=MAX_EPSILON, exclude_min=True), st.just(float("inf")),
                 st.floats(max_value=0.0), st.just(float("nan"))))
def test_every_epsilon_outside_the_budget_is_refused_with_its_range_and_fix(epsilon):
    try:
        DPHypeConfig(epsilon=epsilon, delta=1e-5, k=1, clients=10)
    except ValueError as err:
        assert str(err).startswith(f"epsilon must be a finite number in (0, {MAX_EPSILON:g}], got ")
        assert "set epsilon within it, e.g. 1" in str(err)
    else:
        raise AssertionError(f"epsilon={epsilon!r} was accepted")
