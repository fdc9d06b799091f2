"""Every flag name has one declaration across all commands: one type, one default, one help text,
the same bounds and command-line facts (environment variable, spellings). Read from every
command's spec, sub-apps included, as the user meets them in `--help`."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from residency.cli import walk_commands
from residency.cli.spec import SPEC_ATTR, CommandSpec, Leaf, help_text, spec_of
from residency.flags import Flag, JsonOutput

Declaration = tuple[str, ...]
# Flag names that still mean different things on different commands, each to be renamed on one
# side (issue 41). The test fails when a name is missing here or listed but no longer clashes,
# so the list only shrinks.
NOT_YET_ONE: dict[str, str] = {
    "--dtype": "plan: the modelled model's dtype; demo: the CPU server's, auto by CPU flags",
    "--log": "plan: query logs read (globs, repeatable); serve: the log it appends to",
    "--min-recall": "serve: the canary's one floor; eval retrieval: repeatable exit budgets",
    "--plan": "one plan.json (warm: required; serve: ./plan.json) vs eval coverage's several",
    "--retriever": "four choice sets: plan, eval retrieval, eval coverage, serve",
    "--strategy": "plan: how sections are chosen; eval answers: how an answer is made",
}


def declaration(leaf: Leaf) -> Declaration:
    """What a user meets under one flag name: panel aside (where it is listed, not what it is)."""
    longs = [d for decl in leaf.flag.decls for d in decl.split("/") if d.startswith("--")]
    bounds = [repr(m) for m in leaf.field.metadata if not isinstance(m, Flag)]
    return (
        repr(leaf.field.annotation),
        repr(leaf.default),
        str(help_text(leaf.field.description, longs or [leaf.spelled])),
        ", ".join(bounds),
        f"envvar={leaf.flag.envvar} comma={leaf.flag.comma} metavar={leaf.flag.metavar} "
        f"show_default={leaf.flag.show_default} spellings={sorted(longs or [leaf.spelled])}",
    )


def clashes(specs: Iterable[tuple[str, CommandSpec]]) -> dict[str, dict[Declaration, list[str]]]:
    """Flag names declared more than one way, each declaration with the commands using it."""
    seen: dict[str, dict[Declaration, list[str]]] = defaultdict(lambda: defaultdict(list))
    for name, spec in specs:
        for leaf in spec.leaves:
            if not leaf.flag.argument:
                seen[leaf.spelled][declaration(leaf)].append(name)
    return {flag: dict(decls) for flag, decls in seen.items() if len(decls) > 1}


def command_specs() -> list[tuple[str, CommandSpec]]:
    """(`residency eval answers`, its spec) for every command built from a model."""
    found = []
    for path, command in walk_commands():
        spec = getattr(getattr(command, "callback", None), SPEC_ATTR, None)
        if spec is not None:
            found.append((" ".join(path), spec))
    return found


def _report(found: dict[str, dict[Declaration, list[str]]]) -> str:
    lines = []
    for flag, decls in sorted(found.items()):
        lines.append(f"{flag}: {len(decls)} declarations")
        lines += [f"    {', '.join(cmds)}: {decl}" for decl, cmds in decls.items()]
    return "\n".join(lines)


def test_every_command_is_walked() -> None:
    names = {name for name, _ in command_specs()}
    assert {"plan", "serve", "warm", "eval answers", "corpus import-squad", "model build"} <= names


def test_every_flag_name_has_one_declaration_across_commands() -> None:
    found = clashes(command_specs())
    new = {flag: decls for flag, decls in found.items() if flag not in NOT_YET_ONE}
    assert not new, "one flag name, several declarations:\n" + _report(new)
    assert set(NOT_YET_ONE) <= set(found), f"one declaration now: {set(NOT_YET_ONE) - set(found)}"


class _Shared(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    json_output: JsonOutput = False
    index: Path | None = Field(default=None, description="Index directory.")


class _Copied(BaseModel):
    """`--json` through the shared declaration; `--index` declared again with another default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    json_output: JsonOutput = False
    index: Path = Field(default=Path("index"), description="Index directory.")


class _Reworded(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    json_output: Annotated[bool, Flag("--json")] = Field(default=False, description="Print JSON.")


def test_a_flag_declared_twice_is_found() -> None:
    found = clashes([("a", spec_of(_Shared)), ("b", spec_of(_Copied)), ("c", spec_of(_Reworded))])
    assert set(found) == {"--index", "--json"}
    assert sorted(sorted(cmds) for cmds in found["--json"].values()) == [["a", "b"], ["c"]]
    assert [sorted(cmds) for cmds in found["--index"].values()] == [["a"], ["b"]]


def test_the_same_declaration_twice_is_one() -> None:
    assert clashes([("a", spec_of(_Shared)), ("b", spec_of(_Shared))]) == {}
