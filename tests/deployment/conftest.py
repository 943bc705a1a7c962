"""The reference the Flower runs of the bundled app on 5 Adult shards compare their pick with, computed once."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import FIVE_SHARD_CANDIDATES

from dphype.ml.reference import candidate_accuracies
from dphype.selection.candidates import load_candidates


@pytest.fixture(scope="session")
def five_shard_accuracies() -> np.ndarray:
    """Every candidate's test accuracy (`FIVE_SHARD_CANDIDATES`) after the bundled app's FedAvg, one round of one
    local epoch on 5 iid Adult shards, trained centrally (`dphype.ml.reference`): Opt is its maximum."""
    return candidate_accuracies("adult", 5, load_candidates(FIVE_SHARD_CANDIDATES), rounds=1, local_epochs=1)
