"""What a client evaluates: a `Task` scores every public candidate on its local data (DP-Hype, Section III).

DP-Hype is task-agnostic: anything with ``maximize`` and ``score(candidates)`` is a task. The protocol
(`dphype.protocol.score_candidates`) and the Flower client (`dphype.flower.client.register_dphype`) take any
task; `dphype.ml.torch_task.TorchTask` is the concrete one of the paper's experiments.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np


class Task(Protocol):
    """Scores every candidate on the client's local data; higher is better iff ``maximize``.

    Attributes:
        maximize: Whether higher scores are better (accuracies) or lower (losses).
    """

    maximize: bool

    def score(
        self,
        candidates: Sequence[Mapping[str, Any]],
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> np.ndarray:
        """Scores in candidate order, NaN for a failed candidate.

        Args:
            candidates: The public candidates (hyperparameter name -> value).
            progress: Called with ``(done, total)`` as the work advances, or ``None``.

        Returns:
            ``(p,)`` scores, one per candidate, or ``(p, j)`` lexicographic keys (column 0 decides, later columns
            break ties; all in the ``maximize`` direction; see `dphype.selection.voting.top_k_votes`).
        """
        ...
