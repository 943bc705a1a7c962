"""Strict JSON for every output of dphype: the console script's ``--json`` line and the bundled app's run summary.

A leaf module: it imports nothing from dphype.
"""

from __future__ import annotations

import math
from typing import Any


def jsonable(obj: Any) -> Any:
    """``obj`` as strict-JSON Python data: arrays and scalars converted, NaN as ``None``, infinities as ``"inf"``."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if getattr(obj, "ndim", 0) > 0 and hasattr(obj, "tolist"):  # numpy / torch arrays
        return jsonable(obj.tolist())
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars
        return jsonable(obj.item())
    if isinstance(obj, float) and not math.isfinite(obj):
        # Strict JSON has no NaN/Infinity: NaN -> null, +-inf (e.g. epsilon = inf, no noise) -> "inf"/"-inf".
        return None if obj != obj else ("inf" if obj > 0 else "-inf")
    return obj
