"""judge/ decides, render/ shows (issue 33): every criterion (max units vs K, mismatches vs allowed, rel L2 vs its
bound, the systematic scale vs its threshold) is decided once in judge/criteria.py and carried as values; no render
module compares a statistic with a threshold, and the bias threshold's rule is written once."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "bnbwd_cli"
ORDERING = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
# What a judgement compares: a statistic or a threshold (Comparison's, Criterion's and Bias's field names).
DECISION_NAMES = {"value", "threshold", "max_units", "mismatches", "allowed_mismatches", "rel_l2", "scale", "stderr",
                  "floor", "z", "tolerance", "scaled", "min_units", "max_abs", "max_ulp"}


def _decisions(source: str) -> list[str]:
    """The ordering comparisons that read like a decision: two operands that are neither a literal nor a len(),
    or an operand that names a statistic or a threshold."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare) or not any(isinstance(op, ORDERING) for op in node.ops):
            continue
        operands = [node.left, *node.comparators]
        plain = [o for o in operands if not isinstance(o, ast.Constant)
                 and not (isinstance(o, ast.Call) and isinstance(o.func, ast.Name) and o.func.id == "len")]
        named = {n.attr for o in operands for n in ast.walk(o) if isinstance(n, ast.Attribute)}
        if len(plain) > 1 or named & DECISION_NAMES:
            found.append(ast.unparse(node))
    return found


def test_no_render_module_compares_a_statistic_with_a_threshold():
    assert not (PACKAGE / "render" / "decision.py").exists()
    found = {path.name: _decisions(path.read_text()) for path in sorted((PACKAGE / "render").glob("*.py"))}
    assert not {name: lines for name, lines in found.items() if lines}, found


def test_the_rule_sees_a_decision():
    """The guard above could pass by seeing nothing: the comparisons render/decision.py made are found."""
    assert _decisions("passed = not (checked and abs(scale) > threshold)") == ["abs(scale) > threshold"]
    assert _decisions("ok = c.mismatches <= c.allowed_mismatches") == ["c.mismatches <= c.allowed_mismatches"]
    assert _decisions("op = '>' if abs(test.value) > 1e-6 else '<='") == ["abs(test.value) > 1e-06"]
    assert _decisions("wide = len(shown) < len(bad) or value < 10000.0") == []


def test_the_bias_threshold_is_written_once():
    uses = [f"{path.relative_to(PACKAGE)}: {line.strip()}" for path in sorted(PACKAGE.rglob("*.py"))
            for line in path.read_text().splitlines() if re.search(r"BIAS_Z\s*\*", line)]
    assert uses == ["judge/tolerance.py: return max(BIAS_Z * stderr, floor)"], uses
