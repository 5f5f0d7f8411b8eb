"""The package's import structure: no circle anywhere, and the core's layers only point down.

Read from the source (ast), module-level and function-level imports alike, so that an import
hidden inside a function still counts as an edge of the drawing in docs/architecture.md.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
CORE = ("ddtree.settings", "ddtree.switches", "ddtree.types", "ddtree._checks", "ddtree.backend", "ddtree.tree",
        "ddtree.verify", "ddtree.tp", "ddtree._triton", "ddtree.width_policy")
# layer of each core module: a module may import only modules of a strictly lower layer (settings and the switches'
# registry are plain Python at the bottom: every layer may read a setting or a variable)
LAYER = {"ddtree.settings": 0, "ddtree.switches": 1, "ddtree._checks": 2, "ddtree.types": 3, "ddtree._triton": 4,
         "ddtree.backend": 5, "ddtree.tree": 6, "ddtree.verify": 6, "ddtree.tp": 6, "ddtree.width_policy": 7}
# the one function-level import the core may keep: the optional Triton kernels, on first use
ALLOWED_LATE = {("ddtree.backend", "ddtree._triton")}


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def ddtree_imports(path: Path) -> list[tuple[str, bool]]:
    """(imported ddtree module, imported inside a function?) for every import in the file."""
    tree = ast.parse(path.read_text())
    late: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            late.update(id(n) for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom)))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ddtree"):
            # `from ddtree import _triton` names a module; `from ddtree import build_tree` the package
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                target = sub if (SRC / Path(*sub.split("."))).with_suffix(".py").exists() else node.module
                found.append((target, id(node) in late))
        elif isinstance(node, ast.Import):
            found.extend((a.name, id(node) in late) for a in node.names if a.name.startswith("ddtree"))
    return found


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted((SRC / "ddtree").rglob("*.py")):
        name = module_name(path)
        graph[name] = {t for t, _ in ddtree_imports(path) if t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Edges between ddtree's top-level parts (a module of the core counts as its own part)."""
    def part(name: str) -> str:
        bits = name.split(".")
        return name if len(bits) == 2 else ".".join(bits[:2])

    out: dict[str, set[str]] = {}
    for src, dsts in graph.items():
        out.setdefault(part(src), set()).update(part(d) for d in dsts if part(d) != part(src))
    return out


def test_the_module_graph_has_no_circle():
    assert find_cycle(import_graph()) is None, f"import circle: {' -> '.join(find_cycle(import_graph()))}"


def test_the_graph_of_the_packages_has_no_circle():
    graph = package_graph(import_graph())
    graph["ddtree"] = set()   # the package's __init__ re-exports the core; parts import the core's modules
    assert find_cycle(graph) is None, f"package circle: {' -> '.join(find_cycle(graph))}"


@pytest.mark.parametrize("module", CORE)
def test_core_modules_import_only_lower_layers(module):
    path = (SRC / Path(*module.split("."))).with_suffix(".py")
    for target, late in ddtree_imports(path):
        assert target in LAYER, f"{module} imports {target}, outside the core"
        assert LAYER[target] < LAYER[module], (
            f"{module} (layer {LAYER[module]}) imports {target} (layer {LAYER[target]}): core imports point down")
        if late:
            assert (module, target) in ALLOWED_LATE, f"{module} imports {target} inside a function"


def test_the_checker_sees_a_circle_and_a_late_import(tmp_path):
    """The helpers above can fail: a planted circle is found, a function-level import is seen."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from ddtree import tree\n")
    assert ddtree_imports(f) == [("ddtree.tree", True)]


def drawing(graph: dict[str, set[str]]) -> str:
    return "\n".join(f"{k} -> {', '.join(sorted(v))}".rstrip() for k, v in sorted(graph.items()))


def test_the_drawing_in_docs_is_the_code_s():
    doc = (SRC.parent / "docs" / "architecture.md").read_text()
    block = doc.split("<!-- import drawing", 1)[1].split("```", 2)[1].strip()
    now = drawing(package_graph(import_graph()))
    assert block == now, f"docs/architecture.md's import drawing is stale; the code's is:\n{now}"


def test_no_tracked_file_points_outside_the_repository():
    """Code and docs refer to docs/ inside the repository, never to a sibling folder of the checkout."""
    import subprocess

    root = SRC.parent
    files = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout.split()
    outside = "../" + "shared"
    hits = [f for f in files if (root / f).is_file() and outside in (root / f).read_text(errors="ignore")]
    assert hits == [], f"these files point at {outside}: {hits}"
