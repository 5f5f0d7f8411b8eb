"""Programs live in one place per kind (docs/architecture.md "Where programs live"; issue 46): a role installs only
programs from its own files/, nothing under tools/ is installed on a host, and no bench script imports a test
module (nor a test-bed or training one), and they import each other by name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def role_program_sources() -> list[tuple[str, str]]:
    """(task file, source) for every .py a role's task copies, runs or defaults to."""
    found = []
    for path in sorted((ROOT / "roles").glob("*/*/*.yml")):
        if path.parent.name not in ("tasks", "defaults"):
            continue
        code = "\n".join(line.split("#", 1)[0] for line in path.read_text().splitlines())   # comments dropped
        for m in re.finditer(r"([\w{}./ |'\"-]*?\b[\w-]+\.py)\b", code):
            text = m.group(1).strip(" '\"")
            if "/usr/" in text or "/opt/" in text or "bin/" in text.split("files/")[0]:
                continue                                      # a path on the host, not a source
            if "tests/" in text:
                continue                                      # a message naming a test
            found.append((str(path.relative_to(ROOT)), text))
    return found


def test_roles_install_programs_only_from_their_own_files():
    sources = role_program_sources()
    assert sources, "no program source found: the scan is broken"
    outside = [(task, src) for task, src in sources
               if "../" in src or src.startswith("tools/")
               or not (ROOT / "roles" / task.split("/")[1] / "files" / Path(src).name).exists()]
    assert outside == [], outside


def test_nothing_under_tools_is_installed_on_a_host():
    tasks = "\n".join(p.read_text() for p in (ROOT / "roles").glob("*/*/*.yml"))
    assert not re.search(r"(src|dest|cmd|argv).*\btools/", tasks)


def test_no_bench_test_bed_or_training_module_imports_a_test_module():
    importers = []
    for path in sorted(p for d in ("bench", "testbed", "training") for p in (ROOT / d).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            importers += [(str(path.relative_to(ROOT)), n) for n in names if n == "tests" or n.startswith("tests.")]
    assert importers == [], importers


def test_the_packages_import_each_other_by_name_not_through_sys_path():
    """bench/, testbed/, training/ and tools/ are packages run from the project root (`python3 -m bench.X`); a
    `sys.path.insert` in them or in the tests would make a module importable twice under two names (issue 73)."""
    found = []
    for d in ("bench", "testbed", "training", "tools", "tests"):
        for path in sorted((ROOT / d).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and node.func.attr in ("insert", "append") and ast.unparse(node.func.value) == "sys.path":
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == [], found
    assert all((ROOT / d / "__init__.py").is_file() for d in ("bench", "testbed", "training", "tools"))
