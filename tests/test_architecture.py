"""The package's import graph, read from the source with ast: no cycles, and the layering of
the architecture ("who may import whom") for the leaf rooms and the report.

Every import counts, including those inside functions and under `if TYPE_CHECKING:`: a cycle a
type checker needs is still a cycle a reader has to untangle.
"""

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "openjarvis"

# Modules at the package's root that any room may import: each imports nothing of openjarvis
# but the others in this set (checked below).
SHARED_LEAVES = frozenset(
    {
        "openjarvis.engine_kinds",
        "openjarvis.errors",
        "openjarvis.intervals",
        "openjarvis.metrics",
        "openjarvis.paths",
        "openjarvis.records",
        "openjarvis.reference",
    }
)

# Room -> the other rooms it may import, as the architecture draws it. Rooms not named here
# (cli, serve, tui, evals, runtime) are not constrained by this test beyond having no cycles.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "report": frozenset({"store"}),
    "power": frozenset(),
    "store": frozenset(),
    "kernels": frozenset(),
}


def module_files(source: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, whether it is a package's __init__) for every .py file."""
    modules = {}
    for path in sorted((source / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(source).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        modules[".".join(parts)] = (path, is_package)
    return modules


def imported_names(tree: ast.Module, module: str, is_package: bool) -> Iterator[str]:
    """Every dotted name an import statement of `tree` may load, relative imports resolved.

    `from a.b import c` yields `a.b` and `a.b.c`: c may be a submodule or a name in a.b.
    """
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                origin = ".".join([*base, *([node.module] if node.module else [])])
            else:
                assert node.module is not None
                origin = node.module
            yield origin
            yield from (f"{origin}.{alias.name}" for alias in node.names)


def import_graph(source: Path = SOURCE) -> dict[str, set[str]]:
    """Module -> the modules of the package it imports (edges to itself left out)."""
    modules = module_files(source)
    graph: dict[str, set[str]] = {}
    for module, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        names = set(imported_names(tree, module, is_package))
        graph[module] = {name for name in names if name in modules and name != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    lowest: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = lowest[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                lowest[module] = min(lowest[module], lowest[target])
            elif target in on_stack:
                lowest[module] = min(lowest[module], index[target])
        if lowest[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def room_of(module: str, packages: set[str]) -> str | None:
    """`openjarvis.report.gate` -> "report"; a module at the package's root has no room."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or module in packages - {PACKAGE} else None


def layering_violations(graph: dict[str, set[str]], source: Path = SOURCE) -> list[str]:
    """Each import the architecture does not allow, as "importer -> imported"."""
    packages = {name for name, (_, is_package) in module_files(source).items() if is_package}
    violations = []
    for module, targets in sorted(graph.items()):
        if module in SHARED_LEAVES:
            violations += [f"{module} -> {target}" for target in sorted(targets - SHARED_LEAVES)]
            continue
        room = room_of(module, packages)
        if room not in MAY_IMPORT:
            continue
        for target in sorted(targets):
            if target in SHARED_LEAVES | {PACKAGE}:
                continue
            if room_of(target, packages) not in {room, *MAY_IMPORT[room]}:
                violations.append(f"{module} -> {target}")
    return violations


def test_the_package_has_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_rooms_import_only_what_the_architecture_allows() -> None:
    assert layering_violations(import_graph()) == []


def test_the_shared_leaves_exist() -> None:
    # A stale name here would let a new module of that name import any room unchecked.
    assert set(module_files(SOURCE)) >= SHARED_LEAVES


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / PACKAGE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def test_a_cycle_through_a_relative_import_under_type_checking_is_found(tmp_path: Path) -> None:
    source = _write(
        tmp_path,
        {
            "__init__.py": "",
            "room/__init__.py": "",
            "room/a.py": "from openjarvis.room.b import thing\n",
            "room/b.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import other\n"
            ),
            "room/c.py": "from . import a\n",
        },
    )
    assert cycles(import_graph(source)) == [["openjarvis.room.a", "openjarvis.room.b"]]


@pytest.mark.parametrize(
    ("importer", "statement", "expected"),
    [
        (
            "report/x.py",
            "from openjarvis.runtime import engines\n",
            [
                "openjarvis.report.x -> openjarvis.runtime",
                "openjarvis.report.x -> openjarvis.runtime.engines",
            ],
        ),
        (
            "store/x.py",
            "def f():\n    import openjarvis.power.meter\n",
            ["openjarvis.store.x -> openjarvis.power.meter"],
        ),
        (
            "errors.py",
            "from openjarvis.store import y\n",
            ["openjarvis.errors -> openjarvis.store", "openjarvis.errors -> openjarvis.store.y"],
        ),
        ("report/x.py", "from openjarvis.store import y\n", []),
        ("kernels/x.py", "from openjarvis.errors import E\n", []),
        ("runtime/x.py", "from openjarvis.report import y\n", []),
    ],
)
def test_layering_refuses_an_import_across_rooms(
    tmp_path: Path, importer: str, statement: str, expected: list[str]
) -> None:
    files = {"__init__.py": "", "errors.py": "", "power/meter.py": "", "runtime/engines.py": ""}
    for room in ("report", "store", "runtime", "power", "kernels"):
        files[f"{room}/__init__.py"] = ""
        files[f"{room}/y.py"] = ""
    files[importer] = statement
    source = _write(tmp_path, files)
    assert layering_violations(import_graph(source), source) == expected


EXPERIMENTAL = "openjarvis.kernels.experimental"


def test_no_module_of_the_package_imports_the_experimental_kernels() -> None:
    importers = {
        module
        for module, targets in import_graph().items()
        if not module.startswith(EXPERIMENTAL)
        and any(target.startswith(EXPERIMENTAL) for target in targets)
    }
    assert importers == set()


def test_importing_the_kernels_leaves_the_overlap_code_unloaded() -> None:
    pytest.importorskip("torch")
    # A fresh interpreter: this one may have loaded the module for another test.
    probe = (
        "import sys, openjarvis.kernels; print(sorted(m for m in sys.modules if 'overlap' in m))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert loaded.strip() == "[]"
    # The probe can see the module when it is loaded: this test can fail.
    probe = probe.replace("openjarvis.kernels;", "openjarvis.kernels.experimental.overlap;")
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert loaded.strip() == "['openjarvis.kernels.experimental.overlap']"
