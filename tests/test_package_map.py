"""The package map of docs/architecture.md holds: one home for click types and for JSON, small modules.

Read from the source (AST), not by importing: the checks see every module, loaded or not.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "bnbwd_cli"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


@functools.cache
def modules() -> dict[str, ast.Module]:
    """Every module of the package, parsed once for all the tests of this file (the trees are only read)."""
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
    """cli/, render/ and files/ (core/ is split by its own rule: one module per stage of the math)."""
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
    """Options that travel together go in a frozen dataclass, so a call names what it passes. core/ is exempt;
    api.py's backward/check keep the keyword signatures docs/usage.md promises."""
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


# Calls flow down (docs/architecture.md): the faces (the package's __init__, then cli/ and api.py) -> app/ -> the
# parts (render/, judge/, core/, files/, runtime.py, which may use one another) -> the leaves. Every import counts,
# those inside functions and under TYPE_CHECKING too: a lazy import is still a dependency.
LEAVES = {"spec.py", "layout.py", "dtypes.py", "errors.py", "literal.py", "op.py", "_version.py", "status.py", "scratch.py"}
PARTS = ("render/", "judge/", "core/", "files/", "runtime.py")
COMMANDS = {"cli/run.py", "cli/verify.py", "cli/check.py"}


def rank(name: str) -> int:
    """4 the package's __init__, 3 a face (cli/, api.py and its api_arguments.py, __main__.py), 2 app/, 1 a part,
    0 a leaf."""
    if name == "__init__.py":
        return 4
    if name.startswith("cli/") or name in ("api.py", "api_arguments.py", "__main__.py"):
        return 3
    if name.startswith("app/"):
        return 2
    if name.startswith(PARTS):
        return 1
    assert name in LEAVES, f"{name}: a module in no layer (add it to one, here and in docs/architecture.md)"
    return 0


def module_file(dotted: str) -> str | None:
    """bnbwd_cli.a.b -> "a/b.py" or "a/b/__init__.py" (relative to the package), None when no such module."""
    parts = dotted.split(".")[1:]
    if not parts:
        return "__init__.py"
    for candidate in ("/".join(parts) + ".py", "/".join(parts) + "/__init__.py"):
        if (PACKAGE / candidate).is_file():
            return candidate
    return None


def imported(tree: ast.Module) -> set[str]:
    """The package's modules a module imports (as files relative to the package)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            # `from bnbwd_cli.app import run`: the module bnbwd_cli.app.run when there is one, else bnbwd_cli.app.
            names = [f"{node.module}.{alias.name}" if module_file(f"{node.module}.{alias.name}") else node.module
                     for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("bnbwd_cli."):
            names = [node.value]  # a module imported by its name (cli/main.COMMANDS, importlib.import_module)
        else:
            continue
        found |= {module_file(name) for name in names if name.split(".")[0] == "bnbwd_cli"}
    return found - {None}


def _is_cli(name: str) -> bool:
    return name.startswith("cli/") or name == "__main__.py"


def test_imports_flow_down():
    upward, sideways = [], []
    for name, tree in modules().items():
        for target in imported(tree):
            if rank(target) > rank(name):
                upward.append(f"{name} -> {target}")
            elif rank(target) == rank(name) == 3 and _is_cli(name) != _is_cli(target):
                sideways.append(f"{name} -> {target}")  # cli/ and api.py: two faces of app/, neither uses the other
            elif name in COMMANDS and target in COMMANDS and name != target:
                sideways.append(f"{name} -> {target}")  # commands share through app/, cli/params.py, cli/show.py
    assert not upward and not sideways, (upward, sideways)


def test_the_walker_sees_lazy_imports():
    """The guard above could pass by seeing nothing: run's lazy import of the report is found, and so are the
    commands the group imports by name."""
    assert "cli/show.py" in imported(modules()["cli/run.py"])
    assert {"app/run.py", "app/inputs.py"} <= imported(modules()["cli/run.py"])
    assert {"cli/run.py", "cli/verify.py", "cli/check.py"} <= imported(modules()["cli/main.py"])


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each set of modules that import one another, directly or round a loop (Tarjan's strongly connected
    components of more than one module, or one that imports itself), as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for target in sorted(graph.get(name, ())):
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            members = stack[stack.index(name):]
            del stack[stack.index(name):]
            if len(members) > 1 or name in graph.get(name, ()):
                cycles.append(sorted(members))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(cycles)


def test_no_import_cycle_even_inside_a_layer():
    """Flowing down between layers is not enough: two modules of one layer that import each other (lazily or
    for annotations only, counted as above) are one concern split in two, or a shared helper in the wrong home."""
    graph = {name: imported(tree) for name, tree in modules().items()}
    assert import_cycles(graph) == [], [
        [f"{a} -> {b}" for a in cycle for b in sorted(graph[a]) if b in cycle] for cycle in import_cycles(graph)]


def test_the_cycle_finder_finds_cycles():
    """The guard above could pass by finding nothing: a loop of three, a pair and a self-import are found, a
    diamond is not."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f", "g"}, "f": {"h"}, "g": {"h"},
             "h": set(), "x": {"y"}, "y": {"x"}, "z": {"z"}}
    assert import_cycles(graph) == [["a", "b", "c"], ["x", "y"], ["z"]]


def test_app_and_core_never_print_nor_parse():
    """app/ and core/ take arguments and return values: no click, no rich, no print, no sys.stdout/stderr, no
    os.environ (the environment is runtime.py's)."""
    offenders = []
    for name, tree in modules().items():
        if not name.startswith(("app/", "core/")):
            continue
        for node in ast.walk(tree):
            text = ast.unparse(node) if isinstance(node, (ast.Import, ast.ImportFrom, ast.Call, ast.Attribute)) else ""
            if isinstance(node, (ast.Import, ast.ImportFrom)) and any(word in text for word in ("click", "rich")):
                offenders.append(f"{name}:{node.lineno} {text}")
            elif isinstance(node, ast.Call) and ast.unparse(node.func) == "print":
                offenders.append(f"{name}:{node.lineno} {text}")
            elif isinstance(node, ast.Attribute) and text in ("sys.stdout", "sys.stderr", "os.environ"):
                offenders.append(f"{name}:{node.lineno} {text}")
    assert not offenders, offenders
