"""A package `__init__` that re-exports its submodules' names without importing them (PEP 562).

`from residency.index import open_index` still works, but `import residency.corpus.samples` no
longer drags faiss, bm25s, numpy and aiohttp in through the package's siblings, so the CLI's
`--help` stays instant. The names are written once, as the `__init__`'s
``if TYPE_CHECKING:`` imports (what mypy and readers see); `lazy_exports` reads that block from
the source and imports a submodule on the first access of one of its names, as
scientific-python's `lazy_loader.attach_stub` does with a stub file.

    if TYPE_CHECKING:
        from residency.index.store import open_index
    __getattr__ = lazy_exports(__name__, __file__)
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from pathlib import Path


def exported_names(init_file: str) -> dict[str, tuple[str, str]]:
    """name -> (module, attribute) for every ``from M import A [as name]`` under the file's
    top-level ``if TYPE_CHECKING:``."""
    tree = ast.parse(Path(init_file).read_text(encoding="utf-8"), filename=init_file)
    table: dict[str, tuple[str, str]] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom) and stmt.module and stmt.level == 0:
                    for alias in stmt.names:
                        table[alias.asname or alias.name] = (stmt.module, alias.name)
    return table


def lazy_exports(package: str, init_file: str) -> Callable[[str], object]:
    """The module `__getattr__` for `package`: import the submodule that holds `name` on first
    use and keep the value on the package, so later reads are plain attribute reads.

    A name may not also be a submodule's: importing `package.watch` sets the attribute `watch`
    to the module, and `__getattr__` would never be asked for the function of that name (such
    a package re-exports eagerly, as residency.warm does)."""
    table = exported_names(init_file)
    here = Path(init_file).parent
    clashes = sorted(n for n in table if (here / f"{n}.py").exists() or (here / n).is_dir())
    if clashes:
        raise ImportError(f"{package}: {', '.join(clashes)} name both an export and a submodule")

    def __getattr__(name: str) -> object:  # noqa: N807 (PEP 562's name)
        where = table.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attribute = where
        value = getattr(importlib.import_module(module), attribute)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
