"""An error's first line says what is wrong and the fix in under 120 characters; details go on later lines.

A static scan of every ``raise`` in dphype/ whose message is a string, an f-string or a sum of them: the first line's
length with each placeholder counted as `PLACEHOLDER` characters. `LEFT` counts, per module, the messages still
over the limit: a module may only shorten them (the count must then go down here), never add one.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 120
#: What a formatted value adds to a line, as the scan counts it (a name, a number, a short repr).
PLACEHOLDER = 10
#: Modules whose first lines are not all short yet, and how many of them are long.
LEFT = {
    "dphype/app/run_config.py": 3, "dphype/central/dpareto.py": 1, "dphype/checks.py": 1, "dphype/cli/bench.py": 1,
    "dphype/cli/demo.py": 2, "dphype/cli/roster.py": 2, "dphype/cli/run.py": 2, "dphype/flower/final_training.py": 3,
    "dphype/flower/local.py": 2, "dphype/flower/server/committee_server.py": 3,
    "dphype/flower/server/readiness.py": 3, "dphype/flower/tally_node.py": 3, "dphype/ml/data.py": 2,
    "dphype/ml/ksweep.py": 5, "dphype/ml/oracles/votes.py": 1, "dphype/ml/training.py": 1,
    "dphype/ml/validation.py": 1, "dphype/node/policy.py": 2, "dphype/privacy/accounting.py": 1,
    "dphype/privacy/evaluation.py": 1, "dphype/privacy/winner.py": 1, "dphype/runs.py": 2,
    "dphype/secure/committee.py": 2, "dphype/secure/roster.py": 7, "dphype/secure/secagg.py": 2,
    "dphype/secure/secagg_params.py": 4, "dphype/secure/secure_sum.py": 1, "dphype/selection/candidates.py": 2,
    "dphype/selection/plan_result.py": 1, "dphype/selection/planner.py": 1, "dphype/selection/voting.py": 1,
}


def static_text(node: ast.expr) -> str | None:
    """A message expression's text, each placeholder as PLACEHOLDER characters; None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "x" * PLACEHOLDER for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = static_text(node.left), static_text(node.right)
        if left is None and right is None:
            return None
        return (left if left is not None else "x" * PLACEHOLDER) + (right if right is not None else "x" * PLACEHOLDER)
    return None


def first_lines(path: Path) -> list[tuple[int, str]]:
    """``(line number, first line)`` of every raised message in ``path`` (a Refusal's message: its 2nd argument)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
            name = getattr(node.exc.func, "id", getattr(node.exc.func, "attr", ""))
            args = node.exc.args
            text = static_text(args[1] if name == "Refusal" and len(args) > 1 else args[0])
            if text is not None:
                out.append((node.lineno, text.split("\n")[0]))
    return out


def test_the_scan_reads_fstrings_sums_and_refusals(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('def f(x):\n    raise ValueError(f"x={x} is bad: " + "set x\\nwhy")\n'
                      'def g():\n    raise Refusal("code", "short")\n')
    assert first_lines(module) == [(2, "x=" + "x" * PLACEHOLDER + " is bad: set x"), (4, "short")]


def test_every_error_first_line_is_short_but_the_modules_left():
    long: dict[str, list[str]] = {}
    for path in sorted((ROOT / "dphype").rglob("*.py")):
        for line, first in first_lines(path):
            if len(first) >= LIMIT:
                long.setdefault(str(path.relative_to(ROOT)), []).append(f"{line}: {first[:60]}...")
    grown = {module: lines for module, lines in long.items() if len(lines) > LEFT.get(module, 0)}
    assert not grown, f"shorten these first lines to < {LIMIT} characters (details on the next lines): {grown}"
    shrunk = {module: count for module, count in LEFT.items() if len(long.get(module, [])) < count}
    assert not shrunk, f"lower LEFT to what is left: {shrunk}"
