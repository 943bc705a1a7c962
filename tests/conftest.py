"""Every test runs with a private ``FLWR_HOME`` (so no node ledger is written into the real home) and without
an inherited ``DPHYPE_NODE_POLICY`` (so node policies come only from what a test sets); ``recorded_votes``
records the vectors DP-Hype clients hand to SecAgg+; ``flower_log`` holds what Flower's logger writes."""

from __future__ import annotations

import io
import logging

import pytest

from dphype.node.policy import POLICY_ENV


@pytest.fixture(autouse=True)
def private_flwr_home(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("flwr-home")
    monkeypatch.setenv("FLWR_HOME", str(home))
    monkeypatch.delenv(POLICY_ENV, raising=False)
    return home


@pytest.fixture
def record_returns(monkeypatch):
    """``record_returns(owner, name)`` replaces ``owner.name`` (for the test) by a wrapper that appends what each
    call returns to the list it returns."""

    def record(owner, name):
        returned = []
        original = getattr(owner, name)

        def recording(*args, **kwargs):
            returned.append(original(*args, **kwargs))
            return returned[-1]

        monkeypatch.setattr(owner, name, recording)
        return returned

    return record


@pytest.fixture
def recorded_votes(record_returns):
    """Every encoded vector a DP-Hype client hands to SecAgg+ (its noise comes from the secure generator, so a
    test that checks that the released sum is exact compares it with these)."""
    from dphype.modes import SumRelease

    return record_returns(SumRelease, "ballot")


@pytest.fixture
def flower_log():
    """What Flower's logger (``flwr``) writes while the test runs, as a ``StringIO``."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("flwr")
    logger.addHandler(handler)
    yield stream
    logger.removeHandler(handler)
