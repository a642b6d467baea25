"""The package map of DESIGN.md section 6 holds: one home for click types and for JSON, small modules.

Read from the source (AST), not by importing: the checks see every module, loaded or not.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "bnbwd_cli"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def modules() -> dict[str, ast.Module]:
    return {str(path.relative_to(PACKAGE)): ast.parse(path.read_text()) for path in sorted(PACKAGE.rglob("*.py"))}


def test_every_click_type_lives_in_cli_params():
    homes = {
        (name, node.name)
        for name, tree in modules().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and any(ast.unparse(base).endswith("ParamType") for base in node.bases)
    }
    assert {"ArraySource", "ByteSize", "OutputList", "ToleranceValue", "MismatchValue", "KeyPair"} <= {c for _, c in homes}
    assert {name for name, _ in homes} == {"cli/params.py"}, homes


def test_one_json_writer_and_one_home_for_schema_versions():
    writers, versions = set(), set()
    for name, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("json.dumps", "json.dump"):
                writers.add(name)
            if isinstance(node, ast.Assign) and any("SCHEMA_VERSION" in ast.unparse(t) for t in node.targets):
                versions.add(name)
    assert writers == {"render/json.py"} and versions == {"render/json.py"}, (writers, versions)


def test_click_layer_render_and_files_stay_small():
    """cli/, render/ and files/ (core/ has its own split, tracked in issue 16)."""
    too_big = []
    for name, tree in modules().items():
        if not name.startswith(("cli/", "render/", "files/")):
            continue
        lines = (PACKAGE / name).read_text().count("\n")
        if lines > MAX_MODULE_LINES:
            too_big.append(f"{name}: {lines} lines")
        too_big += [f"{name}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
                    for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not too_big, too_big


MAX_PARAMETERS = 6


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[str]:
    args = node.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs] + [a.arg for a in (args.vararg, args.kwarg) if a]
    return [name for name in names if name not in ("self", "cls")]


def test_no_function_outside_core_takes_more_than_six_parameters_or_sixty_lines():
    """Issue 16: options that travel together go in a frozen dataclass. core/ is split on its own branch;
    api.py's backward/check keep the keyword signatures DESIGN.md section 5 promises."""
    too_wide, too_long = [], []
    for name, tree in modules().items():
        if name.startswith("core/"):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            label = f"{name}:{node.lineno} {getattr(node, 'name', 'lambda')}"
            if name != "api.py" and len(_parameters(node)) > MAX_PARAMETERS:
                too_wide.append(f"{label}: {_parameters(node)}")
            if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                too_long.append(f"{label}: {node.end_lineno - node.lineno + 1} lines")
    assert not too_wide and not too_long, (too_wide, too_long)
