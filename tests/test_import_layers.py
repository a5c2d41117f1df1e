"""Imports flow down the pipeline: DESIGN.md's picture, checked by reading every kiln module's imports.

    capture -> aot -> prims -> codegen -> runtime, with symbolic under all of them

A stage folder may import the stages drawn below it and the ground modules (`kiln/errors.py`,
`config.py`, `log.py`, `trace.py`), never a stage above it nor the modules above the stages
(`kiln.pipeline`, which composes them, the API, the benchmarks). Imports are read from the source
(`ast`), function-level ones included: an import inside a function is still a dependency, only a
later one. Within `kiln/capture` no two modules may import each other, however indirectly
([Note: capture's modules import down, handlers call across] in kiln/capture/__init__.py).
"""
from __future__ import annotations

import ast
import pathlib

import kiln

KILN = pathlib.Path(kiln.__file__).parent

# The stages from the top of the picture down; each may import those after it.
STAGES = ("capture", "aot", "prims", "codegen", "runtime", "symbolic")
# Edges against the picture's order, each with its reason. codegen lowers prim graphs and reads
# one table of the prims' own (the extern prims and the ATen overloads they mirror).
EXCEPTIONS = {("codegen", "prims"): "codegen reads kiln.prims.externs: EXTERN_OF_ATEN, ATEN_OF_PRIM"}
GROUND = ("errors", "config", "log", "trace")            # kiln/<name>.py: importable from anywhere
ABOVE = ("__init__", "api", "backends", "cli", "doctor", "pipeline", "bench", "testing", "report")


def layer(module: str) -> str:
    """`kiln.codegen.host` -> "codegen"; `kiln.log` -> "log"; `kiln` -> "__init__"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def allowed(source: str, target: str) -> bool:
    """Whether a module of layer `source` may import one of layer `target`."""
    if source == target or target in GROUND:
        return True
    if source in ABOVE:
        return True
    if source in GROUND:
        return False
    if target in ABOVE:
        return False
    return STAGES.index(source) < STAGES.index(target) or (source, target) in EXCEPTIONS


def imports_of(module: str, source: str, is_package: bool, known: set[str]) -> list[tuple[str, int]]:
    """(imported kiln module, line) for every import in `source`, module- and function-level.
    `from package import name` counts as importing the submodule where `name` is one."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            subs = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known]
            found += [(m, node.lineno) for m in subs] or [(base, node.lineno)]
    return [(m, line) for m, line in found if m == "kiln" or m.startswith("kiln.")]


def read_modules(root: pathlib.Path = KILN) -> dict[str, tuple[str, bool]]:
    """module name -> (source, is_package) for every .py file of the kiln package."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path.read_text(), is_package)
    return modules


def import_graph(modules: dict[str, tuple[str, bool]]) -> dict[str, list[tuple[str, int]]]:
    known = set(modules)
    return {m: imports_of(m, src, pkg, known) for m, (src, pkg) in modules.items()}


def upward_imports(graph: dict[str, list[tuple[str, int]]]) -> list[str]:
    return [f"{m}:{line} imports {target} ({layer(m)} -> {layer(target)})"
            for m, edges in graph.items() for target, line in edges if not allowed(layer(m), layer(target))]


def circles(graph: dict[str, list[tuple[str, int]]], within: str) -> list[list[str]]:
    """The strongly connected groups (more than one module) among the modules under `within`."""
    nodes = [m for m in graph if m.startswith(within + ".")]
    edges = {m: {t for t, _ in graph[m] if t in graph and t.startswith(within + ".") and t != m} for m in nodes}
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v):       # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))
    for v in nodes:
        if v not in index:
            visit(v)
    return groups


def test_every_module_has_a_layer():
    unknown = {layer(m) for m in read_modules()} - set(STAGES) - set(GROUND) - set(ABOVE)
    assert not unknown, f"modules of kiln outside the table of layers: {sorted(unknown)}; add them to it"


def test_no_stage_imports_up_the_pipeline():
    upward = upward_imports(import_graph(read_modules()))
    assert not upward, "imports up the pipeline:\n" + "\n".join(upward)


def test_no_import_circle_among_captures_modules():
    found = circles(import_graph(read_modules()), "kiln.capture")
    assert not found, f"kiln/capture's modules import each other in a circle: {found}"


def test_the_checker_finds_a_planted_upward_import():
    """A runtime module that reads a host program from codegen, inside a function, and a codegen
    module that calls the pipeline: both are reported; downward imports are not."""
    modules = read_modules()
    modules["kiln.runtime.planted"] = ("def load():\n    from kiln.codegen.host import HostProgram\n", False)
    modules["kiln.codegen.planted"] = ("from kiln.pipeline import compile_graph_module\n"
                                       "from kiln.runtime import cache\nfrom kiln import log\n", False)
    upward = upward_imports(import_graph(modules))
    assert upward == ["kiln.runtime.planted:2 imports kiln.codegen.host (runtime -> codegen)",
                      "kiln.codegen.planted:1 imports kiln.pipeline (codegen -> pipeline)"]


def test_the_checker_finds_a_planted_circle_in_capture():
    modules = read_modules()
    modules["kiln.capture.planted_a"] = ("from kiln.capture import planted_b\n", False)
    modules["kiln.capture.planted_b"] = ("def f():\n    from kiln.capture.planted_a import g\n", False)
    assert circles(import_graph(modules), "kiln.capture") == [["kiln.capture.planted_a", "kiln.capture.planted_b"]]
