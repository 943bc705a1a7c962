"""How a client validates its candidates: one held-out split, or cross-validation over all its rows.

A client's vote is computed on its own data only, so it may use every row to score the candidates at no privacy
cost. A `Validation` names the scheme:

* ``"split"``: one seeded 80/20 split (`dphype.ml.training.evaluate_candidates`; DP-Hype's Section V-B);
* ``"kfold:F"`` (``"kfold"`` is ``"kfold:5"``): ``F``-fold cross-validation; each fold's models start from their
  own initialisation and batch order (`fold_seed`), and a candidate's accuracy and loss are pooled over all
  held-out rows;
* ``"repeat:R"``: ``R`` independent seeded 80/20 splits, pooled the same way.

The suffix ``":loss"`` ranks by validation loss first and accuracy second (else accuracy first, the loss breaking
ties). `DEFAULT_VALIDATION` is ``"split:loss"`` (the schemes compared: results/ballots.md, the clients' local
signal). `dphype.ml.crossval` trains and scores them; this module imports no torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from dphype.ml.data import split_indices

#: Fraction of a client's data held out by one split (Section V-B).
VALIDATION_FRACTION = 0.2

#: The bundled tasks' and `dphype.ml.torch_task.TorchTask`'s validation.
DEFAULT_VALIDATION = "split:loss"
#: The paper's validation (Section V-B): one 80/20 split.
SINGLE_SPLIT = "split"
#: The folds of ``"kfold"`` without a count.
DEFAULT_FOLDS = 5
#: The most folds or repeated splits a name may ask for.
MAX_FOLDS = 20

_NAME = re.compile(r"^(split|kfold|repeat)(?::(\d+))?(:loss)?$")


@dataclass(frozen=True)
class Validation:
    """A validation scheme (module docstring).

    Attributes:
        kind: ``"split"``, ``"kfold"`` or ``"repeat"``.
        count: The folds (``"kfold"``) or splits (``"repeat"``); 1 for ``"split"``.
        loss_first: Rank by validation loss first, accuracy second.
    """

    kind: str
    count: int = 1
    loss_first: bool = False

    @classmethod
    def parse(cls, value: Any) -> Validation:
        """The scheme a name stands for.

        Args:
            value: ``"split"``, ``"kfold[:F]"`` or ``"repeat:R"``, each optionally followed by ``":loss"``.

        Returns:
            The scheme.

        Raises:
            ValueError: Naming ``validation``, the allowed values and the fix, for anything else.
        """
        allowed = (f"'split', 'kfold:F' (F folds, 2 to {MAX_FOLDS}; 'kfold' is 'kfold:{DEFAULT_FOLDS}') or "
                   f"'repeat:R' (R splits, 2 to {MAX_FOLDS}), each optionally followed by ':loss'")
        match = _NAME.match(value) if isinstance(value, str) else None
        if match is None:
            raise ValueError(f"validation must be one of {allowed}; got {value!r}. Use e.g. "
                             f"validation={DEFAULT_VALIDATION!r}\n({DEFAULT_VALIDATION!r} is the default, "
                             f"{SINGLE_SPLIT!r} the paper's)")
        kind, count, loss = match.group(1), match.group(2), match.group(3) is not None
        if kind == "split":
            if count is not None:
                raise ValueError(f"validation 'split' takes no count, got {value!r}; use 'repeat:{count}' for "
                                 f"{count} splits")
            return cls("split", 1, loss)
        if count is None and kind == "repeat":
            raise ValueError(f"validation 'repeat' needs a count, e.g. 'repeat:5'; got {value!r}")
        number = DEFAULT_FOLDS if count is None else int(count)
        if not 2 <= number <= MAX_FOLDS:
            raise ValueError(f"validation {value!r}: the count must lie in [2, {MAX_FOLDS}], got {number}; "
                             f"use e.g. {kind}:{DEFAULT_FOLDS}")
        return cls(kind, number, loss)

    @property
    def name(self) -> str:
        """The canonical name (``"kfold"`` reads back as ``"kfold:5"``)."""
        base = "split" if self.kind == "split" else f"{self.kind}:{self.count}"
        return base + (":loss" if self.loss_first else "")

    def ranked(self, keys: np.ndarray) -> np.ndarray:
        """``(..., 2)`` keys ``[accuracy, -loss]`` in this scheme's ranking order (loss first for ``":loss"``)."""
        return keys[..., ::-1].copy() if self.loss_first else keys

    @property
    def accuracy_key(self) -> int:
        """The position of the accuracy among the keys in this scheme's ranking order."""
        return 1 if self.loss_first else 0

    def splits(self, num_samples: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """The sorted ``(training rows, held-out rows)`` of every fold (``"kfold"`` on few rows: leave one out)."""
        if self.kind == "split":
            return [split_indices(num_samples, VALIDATION_FRACTION, seed)]
        if self.kind == "repeat":
            return [split_indices(num_samples, VALIDATION_FRACTION, fold_seed(seed, r)) for r in range(self.count)]
        if num_samples < 2:
            raise ValueError(f"num_samples must be >= 2 to hold out a fold, got {num_samples}")
        perm = np.random.default_rng(seed).permutation(num_samples)
        parts = np.array_split(perm, min(self.count, num_samples))
        return [(np.sort(np.concatenate(parts[:f] + parts[f + 1:])), np.sort(part)) for f, part in enumerate(parts)]


def check_validation(value: Any) -> str:
    """A validation name, checked (`Validation.parse`) and canonical."""
    return Validation.parse(value).name


def fold_seed(seed: int, fold: int) -> int:
    """The training seed of fold ``fold`` (initialisation, batch order, dropout) of a client seeded ``seed``."""
    return int(np.random.SeedSequence([seed, fold]).generate_state(1)[0])


