"""An error's first line says what is wrong and the fix in under 120 characters; details go on later lines.

A static scan of every ``raise`` in dphype/ whose message is a string, an f-string or a sum of them: the first line's
length with each placeholder counted as `PLACEHOLDER` characters.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 120
#: What a formatted value adds to a line, as the scan counts it (a name, a number, a short repr).
PLACEHOLDER = 10


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


def test_every_error_first_line_is_short():
    long = [f"{path.relative_to(ROOT)}:{line}: {first[:60]}..." for path in sorted((ROOT / "dphype").rglob("*.py"))
            for line, first in first_lines(path) if len(first) >= LIMIT]
    assert not long, f"shorten these first lines to < {LIMIT} characters (details on the next lines): {long}"
