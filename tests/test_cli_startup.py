"""`residency --help` is instant (issue #23): importing the CLI and rendering every command's help
loads none of the heavy libraries; a command imports them when it runs. The time it takes is
measured in benchmarks/test_bench_cli_startup.py; here, what gets imported (it cannot flake).

Each check runs in a fresh interpreter: this test process has long since imported everything.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
# Retrieval (faiss, bm25s, numpy, scipy), the HTTP clients, the model builders.
HEAVY = ("faiss", "bm25s", "numpy", "scipy", "aiohttp", "httpx", "torch", "transformers", "sklearn")
# The packages whose `__init__` re-exports lazily (residency/lazy_exports.py).
LAZY_PACKAGES = (
    "residency.bench",
    "residency.corpus",
    "residency.demo",
    "residency.eval.answers",
    "residency.index",
    "residency.retrieval",
    "residency.vllm_client",
    "residency.warm",
)

_HELP_EVERYTHING = """
import json, sys
from typer.testing import CliRunner
from residency.cli import app, walk_commands

helped = []
for path, _ in list(walk_commands()):
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0, (path, result.output)
    assert "Usage" in result.output, (path, result.output)
    helped.append(" ".join(path))
heavy = sorted(m for m in sys.modules if m.split(".")[0] in sys.argv[1].split(","))
typer_rich = "typer.rich_utils" in sys.modules
print(json.dumps({"helped": helped, "heavy": heavy, "typer_rich": typer_rich}))
"""


def _fresh(code: str, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return result


def test_every_help_renders_without_a_heavy_import() -> None:
    result = _fresh(_HELP_EVERYTHING, ",".join(HEAVY))
    # The walk reached the root, the commands and the groups' subcommands.
    assert {"", "plan", "serve", "eval", "eval coverage", "model build"} <= set(result["helped"])
    top_level = {m.split(".")[0] for m in result["heavy"]}
    assert top_level == set(), f"--help imported {sorted(top_level)} ({result['heavy'][:5]}...)"
    # Groups are drawn by residency/cli/help.py too: typer's rich help pulls in rich.markdown.
    assert result["typer_rich"] is False


def test_importing_the_cli_imports_no_heavy_library() -> None:
    code = (
        "import json, sys, residency.cli\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & set(sys.argv[1].split(',')))\n"
        "print(json.dumps({'heavy': heavy}))\n"
    )
    assert _fresh(code, ",".join(HEAVY))["heavy"] == []


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_a_lazy_package_exports_every_name_it_lists(package: str) -> None:
    from residency.lazy_exports import exported_names

    module = importlib.import_module(package)
    assert module.__file__ is not None
    table = exported_names(module.__file__)
    assert sorted(table) == sorted(module.__all__)
    for name, (source, attribute) in table.items():
        assert getattr(module, name) is getattr(importlib.import_module(source), attribute)


def test_a_lazy_package_refuses_a_name_it_does_not_list() -> None:
    module = importlib.import_module("residency.index")
    with pytest.raises(AttributeError, match=r"residency\.index.*no_such_name"):
        _ = module.no_such_name


_CONSOLE_RUN = """
import json, sys
sys.argv = ["residency", *sys.argv[1:]]
from residency.cli import main
try:
    main()
except SystemExit:
    pass
loaded = sorted(m for m in sys.modules if m.startswith("residency.cli."))
print(json.dumps({"loaded": loaded}))
"""
COMMAND_MODULES = ("plan", "profiles", "index", "warm", "serve", "status", "bench", "demo", "eval")


@pytest.mark.parametrize(
    ("args", "module"),
    [((), None), (("plan",), "plan"), (("eval", "coverage"), "eval"), (("serve",), "serve")],
    ids=str,
)
def test_a_console_run_loads_only_the_command_it_names(
    args: tuple[str, ...], module: str | None
) -> None:
    """Click looks a command up by name (residency/cli/__init__.py LazyGroup): `residency plan`
    imports cli/plan.py and no other command's module; `residency --help` imports none."""
    loaded = set(_fresh(_CONSOLE_RUN, *args, "--help")["loaded"])
    commands = {f"residency.cli.{name}" for name in COMMAND_MODULES}
    assert loaded & commands == ({f"residency.cli.{module}"} if module else set())
