"""The selected candidate on its way from DP-Hype's server to the user's training handlers.

`train_config` packs the candidate under one key of the train config that any Message-API strategy sends
(``FedAvg(...).start(grid, train_config=train_config(result.best_params))``); `selected_candidate` reads it
back in the ClientApp's ``@app.train()``, without knowing its hyperparameter names or mixing them with the
strategy's own keys (``server-round``, a DP wrapper's clipping norm).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from flwr.app import ConfigRecord, Message

from dphype.flower.wire import CANDIDATE_KEY
from dphype.selection.candidates import Candidate


def train_config(candidate: Mapping[str, Any], **extra: bool | int | float | str) -> ConfigRecord:
    """A train config carrying ``candidate`` as JSON under `CANDIDATE_KEY`, plus the ``extra`` entries.

    Args:
        candidate: The selected hyperparameters (JSON-serialisable values), e.g. ``result.best_params``.
        **extra: Further train-config entries for the strategy's own use.

    Returns:
        The ``ConfigRecord`` with the candidate as one JSON object and the ``extra`` entries.

    Raises:
        ValueError: If ``candidate`` is not a non-empty mapping, or ``extra`` holds `CANDIDATE_KEY`.
    """
    if not isinstance(candidate, Mapping) or not candidate:
        raise ValueError(f"candidate must be a non-empty mapping of hyperparameters, got {candidate!r}")
    if CANDIDATE_KEY in extra:
        raise ValueError(f"extra must not hold {CANDIDATE_KEY!r}: it carries the candidate")
    return ConfigRecord({CANDIDATE_KEY: json.dumps(dict(candidate), sort_keys=True), **extra})


def selected_candidate(msg: Message) -> Candidate:
    """The candidate `train_config` put in ``msg``; `ValueError` naming the key if absent or not a JSON object."""
    for record in msg.content.config_records.values():
        if CANDIDATE_KEY in record:
            candidate = json.loads(str(record[CANDIDATE_KEY]))
            if not isinstance(candidate, dict):
                raise ValueError(f"{CANDIDATE_KEY} must hold a JSON object, got {candidate!r}")
            return candidate
    raise ValueError(f"the message carries no {CANDIDATE_KEY!r}: send it with dphype.flower.train_config(candidate)")
