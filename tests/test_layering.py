"""The layout shows the flow, and imports follow it one way (read with `ast` from the sources).

`residency/` holds one package per stage and a few cross-cutting modules at the top. Each
package's `__init__` docstring names what it may import ("May import: ..."); the table below is
the same, and the imports must stay inside it: `planner/` imports nothing of residency, the
cross-cutting modules import only each other, stage packages never import `cli/`, `demo/` or
`bench/`, and `cli/` is imported by nothing but `residency.__main__`.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "residency"
CROSS_CUTTING = frozenset(
    {
        "atomic",
        "cpu_dtype",
        "errors",
        "flags",
        "launcher",
        "lazy_exports",
        "machine",
        "normalize",
        "paths",
        "progress",
        "prompt_language",
        "query_log",
        "stats",
        "tokenizer",
        "vllm_client",
    }
)
STAGES = ("capacity", "planning", "warm", "serve", "eval")
# What each package may import besides planner and the cross-cutting modules, in flow order.
ALLOWED: dict[str, frozenset[str]] = {
    "retrieval": frozenset(),
    "corpus": frozenset({"retrieval"}),
    "timex": frozenset({"corpus"}),
    "index": frozenset({"corpus", "retrieval"}),
    "models": frozenset(),
    "capacity": frozenset(),
    "planning": frozenset({"capacity", "corpus", "index", "models"}),
    "warm": frozenset({"capacity", "planning"}),
    "context": frozenset({"corpus", "index", "planning", "retrieval", "timex"}),
    "status": frozenset(),
    "keep": frozenset({"planning", "warm"}),
    "serve": frozenset(
        {"context", "corpus", "index", "keep", "planning", "retrieval", "status", "timex", "warm"}
    ),
    "eval": frozenset({"context", "corpus", "index", "models", "planning", "retrieval", "timex"}),
}
# keep is the router's own (serve builds it); the commands reach it through serve.
ALLOWED["bench"] = frozenset(ALLOWED) - {"bench", "keep"}
ALLOWED["demo"] = ALLOWED["bench"] | {"bench"}
ALLOWED["cli"] = ALLOWED["demo"] | {"demo"}
TOP_LEVEL_FILES = frozenset({"__init__", "__main__"})
LINE_LIMIT = 400
# The paths of a vLLM server (residency.vllm_client.endpoints): only the client spells them.
VLLM_PATH = re.compile(
    r"^/(v1/[a-z_/]+|health|metrics|tokenize|is_sleeping|reset_prefix_cache|sleep|wake_up)$"
)


def unit_of(path: Path) -> str:
    """The top-level piece of residency a source file belongs to (package or loose module)."""
    first = path.relative_to(PACKAGE).parts[0]
    return first.removesuffix(".py")


def residency_imports(path: Path) -> Iterator[str]:
    """The top-level residency pieces (or 'planner') a file imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "planner":
                yield "planner"
            elif parts[0] == "residency" and len(parts) > 1:
                yield parts[1]


def sources(root: Path) -> list[Path]:
    """Every Python source file under root."""
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def edges() -> dict[str, set[str]]:
    """Which top-level pieces each piece imports (itself left out)."""
    graph: dict[str, set[str]] = {}
    for path in sources(PACKAGE):
        unit = unit_of(path)
        graph.setdefault(unit, set()).update(i for i in residency_imports(path) if i != unit)
    return graph


def test_every_top_level_piece_is_a_stage_a_known_package_or_cross_cutting() -> None:
    found = {unit_of(p) for p in sources(PACKAGE)} - TOP_LEVEL_FILES
    assert found == set(ALLOWED) | CROSS_CUTTING
    for stage in STAGES:
        assert (PACKAGE / stage / "__init__.py").is_file(), stage


def test_planner_imports_nothing_of_residency() -> None:
    for path in sources(ROOT / "planner"):
        assert "residency" not in {
            n.split(".")[0]
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            for n in (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
        }, path


def test_cross_cutting_modules_import_only_each_other() -> None:
    graph = edges()
    for unit in CROSS_CUTTING:
        assert graph.get(unit, set()) <= CROSS_CUTTING | {"planner"}, unit


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_packages_import_only_what_their_docstring_allows(package: str) -> None:
    allowed = ALLOWED[package] | CROSS_CUTTING | {"planner"}
    imported = edges().get(package, set())
    assert imported <= allowed, f"{package} imports {sorted(imported - allowed)}"
    doc = ast.get_docstring(ast.parse((PACKAGE / package / "__init__.py").read_text("utf-8")))
    assert doc is not None, package
    assert "May import:" in doc, package
    said = " ".join(doc.split("May import:", 1)[1].split()).split(".")[0]
    if said == "everything":
        assert package == "cli"
        return
    names = {n.strip() for n in said.split(",")} - {"planner", "the cross-cutting modules"}
    assert names == set(ALLOWED[package]), f"{package}'s docstring says {sorted(names)}"


def test_stages_do_not_import_cli_demo_or_bench_and_cli_is_imported_by_nothing() -> None:
    graph = edges()
    for unit, imported in graph.items():
        if unit not in ("cli", "demo", "bench", "__main__"):
            assert not imported & {"cli", "demo", "bench"}, unit
        if unit != "__main__":
            assert "cli" not in imported or unit == "cli", unit


def test_imports_between_packages_have_no_cycle() -> None:
    graph = edges()
    state: dict[str, str] = {}

    def visit(node: str, trail: tuple[str, ...]) -> None:
        if state.get(node) == "done":
            return
        assert state.get(node) != "open", f"import cycle: {' -> '.join((*trail, node))}"
        state[node] = "open"
        for nxt in graph.get(node, ()):
            visit(nxt, (*trail, node))
        state[node] = "done"

    for node in graph:
        visit(node, ())


@pytest.mark.parametrize("root", ["residency", "planner"])
def test_no_module_over_the_line_limit(root: str) -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in sources(ROOT / root)
        if (n := len(p.read_text("utf-8").splitlines())) > LINE_LIMIT
    }
    assert long == {}


def test_only_the_client_spells_vllm_paths() -> None:
    spelled: list[str] = []
    for path in sources(PACKAGE):
        if unit_of(path) == "vllm_client":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and VLLM_PATH.match(node.value)
            ):
                spelled.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value}")
    assert spelled == []


def test_only_the_client_imports_its_http_library() -> None:
    # The router's upstream calls run on aiohttp (residency/vllm_client/async_client.py says
    # why); everything else holds its session as vllm_client.Session.
    importers = []
    for path in sources(PACKAGE):
        if unit_of(path) == "vllm_client":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n.split(".")[0] == "aiohttp" for n in names):
                importers.append(str(path.relative_to(ROOT)))
    assert importers == []
