"""Selection rules are registered types: a new rule runs wherever a rule is named, its fallback is its own, and an
unknown rule is refused at every entry point."""

import argparse

import numpy as np
import pytest

from dphype.cli import add_selection_arguments
from dphype.config import DPHypeConfig
from dphype.selection import rules
from dphype.selection.candidates import CandidateList, candidate_grid
from dphype.selection.rules import (
    CONFIDENCE_SAMPLES,
    SelectionRule,
    check_rule,
    register_rule,
    rule_names,
    select_batch,
    select_release,
    selection_rule,
)


class Last(SelectionRule):
    """A throwaway rule: always the last candidate; its posterior is the release itself, repeated."""

    name = "last"
    description = "a test's throwaway rule"
    models = False

    def picks(self, y, space, sigma, *, clients, k, settings):
        return np.full(len(y), y.shape[1] - 1)

    def posterior(self, y, space, sigma, *, clients, k, settings):
        return y[0], np.repeat(y, CONFIDENCE_SAMPLES, axis=0)


class Unready(Last):
    """A throwaway rule that never runs itself: it hands over to argmax, saying why."""

    name = "unready"

    def runs_as(self, space, sigma=None):
        return selection_rule("max-votes"), "not ready"


@pytest.fixture
def registered(monkeypatch):
    """``Last`` and ``Unready`` registered for one test; the registry is restored afterwards."""
    monkeypatch.setattr(rules, "_RULES", rules._RULES.copy())
    register_rule(Last)
    register_rule(Unready)


def _parser():
    parser = argparse.ArgumentParser()
    add_selection_arguments(parser)
    return parser


def test_the_registry_holds_the_two_rules_and_the_gp_fallback_is_its_own():
    assert rule_names() == ("max-votes", "gp") and check_rule("gp") == "gp"
    gp, argmax = selection_rule("gp"), selection_rule("max-votes")
    assert gp.models and not argmax.models
    assert gp.runs_as(None) == (argmax, "no feature space given")
    assert gp.runs_as(candidate_grid(lr=[0.1, 1.0, 10.0]).feature_space(), 0.0) == (
        argmax, "no noise: the release is the vote sum itself")
    space = candidate_grid(lr=[0.1, 1.0, 10.0], decay=[0.0, 0.1]).feature_space()
    assert gp.runs_as(space) == (gp, None) and argmax.runs_as(None) == (argmax, None)
    structureless = CandidateList([{"model": m} for m in ("mlp", "cnn", "vit")]).feature_space()
    assert gp.runs_as(structureless) == (argmax, structureless.no_structure)


def test_a_new_rule_runs_wherever_a_rule_is_named(registered):
    y = np.array([[5.0, 1.0, 2.0], [0.0, 9.0, 1.0]])
    batch = select_batch(y, None, 1.0, rule="last")
    assert (batch.picks.tolist(), batch.rule, batch.fallback) == ([2, 2], "last", None)
    sel = select_release(y[0], 1.0, rule="last")
    assert (sel.index, sel.rule, sel.requested, sel.fallback) == (2, "last", "last", None)
    assert sel.p_top == 0.0 and sel.margin == pytest.approx(-3.0)  # its posterior: the release, repeated
    handed = select_release(y[0], 1.0, rule="unready")
    assert (handed.index, handed.rule, handed.requested, handed.fallback) == (0, "max-votes", "unready", "not ready")
    assert DPHypeConfig(1.0, 1e-5, 2, 10, rule="last").rule == "last"
    assert _parser().parse_args(["--rule", "last"]).rule == "last"


def test_a_rule_is_gone_once_its_test_ends(monkeypatch):
    with monkeypatch.context() as patch:
        patch.setattr(rules, "_RULES", rules._RULES.copy())
        register_rule(Last)
        assert check_rule("last") == "last"
    with pytest.raises(ValueError, match="rule must be one of max-votes, gp, got 'last'"):
        check_rule("last")


def test_registration_refuses_a_taken_name(monkeypatch):
    monkeypatch.setattr(rules, "_RULES", rules._RULES.copy())

    class Twice(Last):
        name = "gp"

    with pytest.raises(ValueError, match="selection rule 'gp' is already registered"):
        register_rule(Twice)
    assert rule_names() == ("max-votes", "gp")


@pytest.mark.parametrize("entry", [
    lambda: selection_rule("median"),
    lambda: check_rule("median"),
    lambda: select_batch(np.zeros((1, 3)), None, 1.0, rule="median"),
    lambda: select_release(np.zeros(3), 1.0, rule="median"),
    lambda: DPHypeConfig(1.0, 1e-5, 2, 10, rule="median"),
    lambda: selection_rule(["gp"]),
])
def test_an_unknown_rule_is_refused_at_every_entry_point(entry):
    with pytest.raises(ValueError, match="rule must be one of max-votes, gp, got "):
        entry()


def test_the_cli_offers_the_registered_rules_and_refuses_others():
    parser = _parser()
    assert parser.parse_args([]).rule == rules.DEFAULT_RULE
    with pytest.raises(SystemExit):
        parser.parse_args(["--rule", "median"])


def test_the_retired_rule_name_is_refused_in_one_line_naming_the_new_one(capsys):
    with pytest.raises(ValueError, match=r"^rule='argmax' was renamed: set rule='max-votes'$"):
        check_rule("argmax")
    with pytest.raises(ValueError, match="rule='argmax' was renamed"):
        DPHypeConfig(epsilon=1.0, delta=1e-5, k=2, clients=10, rule="argmax")
    parser = argparse.ArgumentParser()
    add_selection_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--rule", "argmax"])
    assert "argument --rule: rule='argmax' was renamed: set rule='max-votes'" in capsys.readouterr().err
