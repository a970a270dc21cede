"""The package's shape: modules import each other in layers, never in a circle, only the
command line (ferry/cli) parses arguments, plots or prints, and meson installs every module.

Both read the sources in python/ferry with `ast`, so they see every import a module can run:
at the top and inside functions alike. Imports under `if TYPE_CHECKING:` are left out: they
never run, and are how a module names a higher layer's class in its annotations.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

SOURCES = Path(__file__).resolve().parents[2] / "python" / "ferry"

#: The layers, lowest first: a module may import its own layer's modules and lower layers'.
LAYERS: List[Tuple[str, ...]] = [
    ("ferry._binding",),
    ("ferry.errors", "ferry._handle", "ferry._checks", "ferry._pybuffer", "ferry.types", "ferry.quant"),
    ("ferry.stats", "ferry.policy", "ferry.copy2d", "ferry.export"),
    ("ferry.tensor",),
    ("ferry.buffer", "ferry.event", "ferry.backend", "ferry.cuda", "ferry.interop", "ferry.link", "ferry.fetch"),
    ("ferry.ops", "ferry.graph", "ferry._placements", "ferry.alloc"),
    ("ferry.copy_cost", "ferry.paged_plan"),
    ("ferry.pieces",),
    ("ferry.plan", "ferry.copy_path"),
    ("ferry.kv_layers",),
    ("ferry.sched", "ferry.kv", "ferry.paged", "ferry.step", "ferry.block_pool"),
    ("ferry.remote.errors",),
    ("ferry.remote.engine",),
    ("ferry.remote.pulls", "ferry.remote.engine_worker"),
    ("ferry.remote.fetching",),
    ("ferry.remote.server", "ferry.remote.tier"),
    ("ferry.remote.link",),
    ("ferry.remote",),
    ("ferry.residency.specs",),
    ("ferry.residency.prediction",),
    ("ferry.residency.model",),
    ("ferry.residency.rules", "ferry.residency.measure"),
    ("ferry.residency.planner",),
    ("ferry.residency",),
    ("ferry.workloads.common", "ferry.workloads.model_file", "ferry.workloads.devices", "ferry.workloads.estimate",
     "ferry.workloads.paged_tables", "ferry.workloads.trace"),
    ("ferry.workloads.bench_config",),
    ("ferry.workloads.several",),
    ("ferry.workloads.bench_rows",),
    ("ferry.workloads.bench_report",),
    ("ferry.workloads", "ferry.workloads.bench", "ferry.workloads.validate", "ferry.workloads.table",
     "ferry.workloads.plan", "ferry.workloads.paged_plan", "ferry.workloads.residency_plan",
     "ferry.workloads.residency_bench", "ferry.workloads.remote"),
    ("ferry",),
    ("ferry.cli.options", "ferry.cli.text_table", "ferry.cli.progress"),
    ("ferry.cli.option_table",),
    ("ferry.cli.old_spellings",),
    ("ferry.cli.reference",),
    ("ferry.cli.residency", "ferry.cli.remote_hook"),
    ("ferry.cli.bench", "ferry.cli.validate", "ferry.cli.table", "ferry.cli.plan", "ferry.cli.demo",
     "ferry.cli.residency_plan", "ferry.cli.residency_bench", "ferry.cli.paged_plan", "ferry.cli.paged_bench",
     "ferry.cli.remote_serve"),
    ("ferry.cli", "ferry.cli.__main__"),
]

#: What only the command line may import.
CLI_ONLY_IMPORTS = {"argparse", "matplotlib"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SOURCES.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: Dict[str, Path] = {module_name(p): p for p in sorted(SOURCES.rglob("*.py"))}


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of tree but those under `if TYPE_CHECKING:` (their else branch is kept)."""
    stack: List[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def imported_modules(name: str, node: ast.AST) -> Iterator[str]:
    """The modules (of any package) an import statement in module `name` loads, by full name."""
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
            for _ in range(node.level - 1):
                package = package.rpartition(".")[0]
            base = f"{package}.{node.module}" if node.module else package
        else:
            base = node.module or ""
        for a in node.names:
            sub = f"{base}.{a.name}"
            yield sub if sub in MODULES else base


def ferry_imports(name: str) -> Set[str]:
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    found = {m for node in runtime_nodes(tree) for m in imported_modules(name, node)}
    return {m for m in found if m in MODULES and m != name}


GRAPH: Dict[str, Set[str]] = {name: ferry_imports(name) for name in MODULES}


def find_cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    """A list of modules each importing the next, the last importing the first; None if none."""
    done: Set[str] = set()
    path: List[str] = []
    on_path: Set[str] = set()

    def visit(m: str) -> Optional[List[str]]:
        path.append(m)
        on_path.add(m)
        for n in sorted(graph[m]):
            if n in on_path:
                return path[path.index(n):] + [n]
            if n not in done:
                found = visit(n)
                if found:
                    return found
        on_path.discard(path.pop())
        done.add(m)
        return None

    for m in sorted(graph):
        if m not in done:
            found = visit(m)
            if found:
                return found
    return None


def test_meson_installs_every_module() -> None:
    """pip install (meson-python) installs what python/ferry/meson.build lists, and only that."""
    listed = set(re.findall(r"'([\w/]+\.py)'", (SOURCES / "meson.build").read_text(encoding="utf-8")))
    on_disk = {p.relative_to(SOURCES).as_posix() for p in SOURCES.rglob("*.py")}
    assert on_disk - listed == set(), "add these to python/ferry/meson.build"
    assert listed - on_disk == set(), "python/ferry/meson.build lists files that are gone"


def test_the_sources_are_found() -> None:
    assert {"ferry", "ferry.tensor", "ferry.cli", "ferry.cli.bench"} <= set(MODULES)


def test_no_module_imports_in_a_circle() -> None:
    cycle = find_cycle(GRAPH)
    assert cycle is None, "modules import each other in a circle: " + " -> ".join(cycle or [])


def test_find_cycle_sees_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_every_module_has_a_layer() -> None:
    layered = {m for layer in LAYERS for m in layer}
    assert set(MODULES) - layered == set(), "add the new module to LAYERS"
    assert layered - set(MODULES) == set(), "LAYERS names a module that is gone"


def test_imports_go_down_the_layers() -> None:
    level = {m: i for i, layer in enumerate(LAYERS) for m in layer}
    upward = sorted(f"{m} imports {n}" for m, deps in GRAPH.items() for n in deps
                    if level.get(n, -1) > level.get(m, -1))
    assert upward == []


def library_modules() -> List[str]:
    return [m for m in MODULES if m != "ferry.cli" and not m.startswith("ferry.cli.")]


@pytest.mark.parametrize("name", library_modules())
def test_only_the_command_line_parses_plots_or_prints(name: str) -> None:
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):  # TYPE_CHECKING blocks included: the library has no business there either
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"line {node.lineno}: imports {n}" for n in names if n.split(".")[0] in CLI_ONLY_IMPORTS]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
            found.append(f"line {node.lineno}: calls print")
        elif (isinstance(node, ast.Attribute) and node.attr in ("stdout", "stderr")
              and isinstance(node.value, ast.Name) and node.value.id == "sys"):
            found.append(f"line {node.lineno}: writes to sys.{node.attr}")
    assert found == []


#: What `ferry bench`'s formatters may call on the result they print: its finished report, once.
#: Every other figure they print is in that report (BenchReport) or read as a plain attribute.
FORMATTERS_CALL_ON_THE_RESULT = {"finished"}


def result_calls_of_the_formatters(source: str) -> List[str]:
    """Each call a formatter of cli/bench.py (format_*, _head, _tail, _footer, plot_result) makes on its
    result `res` other than FORMATTERS_CALL_ON_THE_RESULT: "function: res.method (line)"."""
    found = []
    for fn in ast.parse(source).body:
        if not isinstance(fn, ast.FunctionDef) or not (fn.name.startswith("format_") or fn.name in (
                "_head", "_tail", "_footer", "plot_result")):
            continue
        for node in ast.walk(fn):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "res"
                    and node.func.attr not in FORMATTERS_CALL_ON_THE_RESULT):
                found.append(f"{fn.name}: res.{node.func.attr} (line {node.lineno})")
    return found


def test_bench_formats_from_its_finished_report_alone() -> None:
    # A formatter calling back into the result row by row is what records built by name replace: a new
    # column is one field of the report and one formatter line.
    assert result_calls_of_the_formatters((SOURCES / "cli" / "bench.py").read_text(encoding="utf-8")) == []
    planted = "def format_x(res):\n    return res.row(2, 'flat')\n\ndef helper(res):\n    return res.row(1, 'x')\n"
    assert result_calls_of_the_formatters(planted) == ["format_x: res.row (line 2)"]
