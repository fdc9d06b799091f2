"""Command-line facts a settings field carries: `Flag` (another spelling, a short name, a help
panel, an environment variable) and `Section` (for a nested model's fields). Plain data, read by
the CLI (`residency/cli/spec.py`), which builds every command's options from its settings model:
the field holds the name, type, bounds, default and help; these hold what only a command line has.

    question_tokens: Annotated[int, Flag("--reserve-question", panel="Reserves")] = Field(...)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Flag:
    """Command-line facts of one field: its spellings (`--reserve-question`, `-tp`,
    `--x/--no-x`), the help panel, whether to show the default, an environment variable, and
    whether a tuple is one comma-separated value rather than a repeatable option."""

    decls: tuple[str, ...] = ()
    panel: str | None = None
    show_default: bool | str = True  # a text shows in place of the value ("CACHE/coverage")
    envvar: str | None = None
    comma: bool = False  # a tuple given as one comma-separated value ("2000,8000")
    argument: bool = False  # positional, not an option
    metavar: str | None = None  # what the help shows for the value ("qdrant URL|PATH")

    def __init__(
        self,
        *decls: str,
        panel: str | None = None,
        show_default: bool | str = True,
        envvar: str | None = None,
        comma: bool = False,
        argument: bool = False,
        metavar: str | None = None,
    ) -> None:
        object.__setattr__(self, "decls", decls)
        object.__setattr__(self, "panel", panel)
        object.__setattr__(self, "show_default", show_default)
        object.__setattr__(self, "envvar", envvar)
        object.__setattr__(self, "comma", comma)
        object.__setattr__(self, "argument", argument)
        object.__setattr__(self, "metavar", metavar)


@dataclass(frozen=True)
class Section:
    """A nested-model field whose fields become options: their panel (`panel`, or per field in
    `panels`), and `Flag`s for fields of a model that carries none (`flags`)."""

    panel: str | None = None
    panels: Mapping[str, str] = field(default_factory=dict)
    flags: Mapping[str, Flag] = field(default_factory=dict)
    skip: frozenset[str] = frozenset()  # fields the command line leaves at their defaults
