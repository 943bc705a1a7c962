"""Property-based test (Hypothesis) of the bundled app's run config (`dphype.app.run_config.AppConfig`): any value of
any key is accepted within its range or refused with a ``ValueError`` that names the key, before any client
works."""

from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dphype.app.run_config import AppConfig
from dphype.checks import MAX_EPSILON

#: The bundled app's run config as `dphype demo` sends it (every key valid).
VALID = {"epsilon": 1.0, "delta": 1e-5, "k": 5, "clients": 10, "release": "sum", "dataset": "adult",
         "candidates": "table3", "seed": 0, "fedavg-rounds": 2, "local-epochs": 1, "fraction-evaluate": 0.0,
         "train-epsilon": 0.0, "clipping-norm": 1.0, "clipping": "server", "connect-timeout": 60.0,
         "round-timeout": 60.0, "tallies": 3}
#: What a run config may carry (Flower's run-config values: bool, int, float, str).
WILD = st.one_of(st.booleans(), st.integers(-10, 10**6), st.floats(allow_nan=True, allow_infinity=True),
                 st.sampled_from([0, -1, 1e9, float("nan"), MAX_EPSILON * 2, "", "x", "table3", "mnist5k", "client"]),
                 st.text(max_size=6))


@settings(max_examples=30, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from([key for key in VALID if key != "candidates"]), WILD, min_size=1, max_size=3))
def test_the_apps_run_config_is_valid_or_refused_naming_a_bad_key(wild):
    run_config = {**VALID, **wild}
    try:
        config = AppConfig.from_run_config(run_config)
    except ValueError as err:
        message = str(err)
        # min_success is the only field spelled otherwise; fraction-evaluate may be refused with train-epsilon
        names = set(wild) | ({"fraction-evaluate"} if "train-epsilon" in wild else set())
        assert any(re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", message) for name in names), message
        return
    assert 0.0 < config.dphype.epsilon <= MAX_EPSILON
    assert config.train_epsilon == 0.0 or 0.0 < config.train_epsilon <= MAX_EPSILON
    assert config.fedavg_rounds >= 1 and config.local_epochs >= 1 and config.tallies >= 3
