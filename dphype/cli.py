"""The ``dphype`` console script.

Each sub-command lives next to the concept it drives and exposes two functions:
``add_arguments(parser)`` and ``run(args) -> dict``. The dict is printed as a
human-readable summary, and with ``--json`` also as one JSON object on the last
line of standard output.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
from typing import Any, Sequence

#: sub-command -> (module implementing add_arguments/run, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "calibrate": ("dphype.accounting_cli", "solve the total noise std sigma for (epsilon, delta, k)"),
    "ledger": ("dphype.ledger", "show this node's privacy ledger: recorded votes and their composed epsilon"),
    "demo": ("server.demo", "DP-Hype on Adult through Flower + SecAgg+, then FedAvg with the winner"),
    "bench": ("simulations.cli", "run one of the paper's benchmark studies"),
    "pareto": ("dphype.central.cli_pareto", "DPareto privacy-utility Pareto front search"),
    "compare": ("dphype.central.cli_compare", "federated DP-Hype vs central private tuning on one task"),
}


class UsageError(ValueError):
    """Bad command-line input; printed without a traceback."""


def _jsonable(obj: Any) -> Any:
    """``obj`` as strict-JSON-serialisable Python data (numpy/torch values, no NaN or infinity)."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if getattr(obj, "ndim", 0) > 0 and hasattr(obj, "tolist"):  # numpy / torch arrays
        return _jsonable(obj.tolist())
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars
        return _jsonable(obj.item())
    if isinstance(obj, float) and not math.isfinite(obj):
        # Strict JSON has no NaN/Infinity: NaN -> null, +-inf (e.g. epsilon = inf, no noise) -> "inf"/"-inf".
        return None if obj != obj else ("inf" if obj > 0 else "-inf")
    return obj


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """Build the parser; only the chosen sub-command's module is imported (start-up stays fast)."""
    parser = argparse.ArgumentParser(prog="dphype", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    chosen = next((a for a in argv if a in COMMANDS), None)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
        p.set_defaults(_module=module)
        if name == chosen:
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    module = importlib.import_module(args._module)
    try:
        result = module.run(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"dphype {args.command}: error: {err}", file=sys.stderr)
        return 2
    if not args.json:
        for key, value in result.items():
            print(f"{key}: {value}")
    else:
        print(json.dumps(_jsonable(result), allow_nan=False))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
