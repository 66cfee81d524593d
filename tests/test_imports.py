"""The package's import graph has no loops: every module imports only modules below it.

Walks every ``import`` in ``tensorgrad/`` (module level and inside functions; ``if
TYPE_CHECKING:`` blocks excepted, since they never run) and fails naming each loop. Importing
``a.b.c`` also runs the ``__init__`` of ``a.b`` unless the importer already lives inside it,
so that counts as an edge too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "tensorgrad"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                skip.update(id(n) for n in ast.walk(inner))
    return skip


def import_graph() -> dict[str, set[str]]:
    """{module: modules it imports}, within the package."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_nodes(tree)
        package = name if _is_package(path) else name.rpartition(".")[0]
        inside = {name, *_ancestors(name)}
        targets: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    targets.add(sub if sub in modules else source)
        for target in targets:
            if target not in modules or target == name:
                continue
            graph[name].add(target)
            graph[name].update(a for a in _ancestors(target) if a not in inside)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_walker_finds_a_planted_loop():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_no_import_loops_inside_the_package():
    graph = import_graph()
    assert len(graph) > 30 and graph[f"{PACKAGE}.autograd"]  # the walk saw the package
    loops = cycles(graph)
    detail = "\n".join(
        " <-> ".join(c) + "\n    " + "\n    ".join(
            f"{a} imports {', '.join(sorted(graph[a] & set(c)))}" for a in c)
        for c in loops)
    assert not loops, f"import loops inside {PACKAGE}/:\n{detail}"


# The back end sits below the op table: the plan, code generation's records and program
# writer, the runtime (and its pipeline cache) and the GPU adapters get what they need from
# the op table handed in by the compiler (as `ops=`), so loading any of them never loads the
# ops.
BELOW_THE_OPS = ("plan", "runtime", "pipelines", "layout", "hostdata", "codegen", "gpu")


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for m in graph[todo.pop()] - seen:
            seen.add(m)
            todo.append(m)
    return seen


def test_the_back_end_does_not_load_the_op_table():
    graph = import_graph()
    back_end = [m for m in graph if any(
        m == f"{PACKAGE}.{b}" or m.startswith(f"{PACKAGE}.{b}.") for b in BELOW_THE_OPS)]
    assert f"{PACKAGE}.runtime" in back_end and f"{PACKAGE}.gpu.native" in back_end
    reaching = {m: sorted(r for r in _reach(graph, m) if r.startswith(f"{PACKAGE}.ops"))
                for m in back_end}
    bad = {m: r for m, r in reaching.items() if r}
    assert not bad, "modules below the op table load it:\n" + "\n".join(
        f"  {m} -> {', '.join(r)}" for m, r in sorted(bad.items()))
