"""Every command's options come from one pydantic model (`residency/cli/spec.py`): the help is the
field's description, the default the field's, the bounds stay on the field, and a refused value
is one line naming the flag as the command spells it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field
from residency_cli import run_cli
from typer.core import TyperGroup
from typer.testing import CliRunner

from residency.cli import walk_commands
from residency.cli.spec import SPEC_ATTR, CommandSpec, build, command, help_text, spec_of
from residency.errors import ConfigError
from residency.flags import Flag, Section


class _Inner(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    depth: int = Field(default=3, ge=1, le=9, description="--depth: how deep.")
    ratio: float = Field(default=0.5, gt=0, le=1, description="A share in (0, 1].")


class _Optional(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    where: str = Field(description="Where it is.")
    secret_key: str | None = Field(default=None, description="A key.")


class _Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    inner: Annotated[_Inner, Section(panel="Inner", flags={"ratio": Flag("--share", "-r")})] = (
        Field(default_factory=_Inner, description="Nested.")
    )
    extra: Annotated[_Optional | None, Section(flags={"where": Flag("--at")})] = Field(
        default=None, description="All or nothing."
    )
    lengths: Annotated[tuple[int, ...], Flag(comma=True)] = Field(
        default=(1, 2), description="Comma-separated."
    )
    tags: tuple[str, ...] = Field(default=(), description="Repeatable.")
    weights: dict[str, float] | None = Field(default=None, description="NAME=W, repeatable.")
    mode: Literal["a", "b"] = Field(default="a", description="A choice.")
    verbose: bool = Field(default=False, description="Talk more.")


SPEC = spec_of(_Args)


def _leaf(param: str) -> object:
    return next(leaf for leaf in SPEC.leaves if leaf.param == param)


def test_nested_fields_become_options_with_the_sections_spellings_and_panel() -> None:
    params = [leaf.param for leaf in SPEC.leaves]
    # A leaf is named after its long flag: --share holds inner.ratio, --at holds extra.where.
    assert params == [
        "depth",
        "share",
        "at",
        "secret_key",
        "lengths",
        "tags",
        "weights",
        "mode",
        "verbose",
    ]
    ratio = _leaf("share")
    assert ratio.flag.decls == ("--share", "-r")  # type: ignore[attr-defined]
    assert ratio.flag.panel == "Inner"  # type: ignore[attr-defined]
    assert ratio.spelled == "--share"  # type: ignore[attr-defined]
    assert _leaf("depth").default == 3  # type: ignore[attr-defined]


def test_values_come_back_as_the_model() -> None:
    given = {
        "depth": 4,
        "share": 1.0,
        "lengths": "5, 6,7",
        "tags": ["x", "y"],
        "weights": ["dense=0.3"],
        "mode": "b",
        "verbose": True,
    }
    args = build(SPEC, given)
    assert args == _Args(
        inner=_Inner(depth=4, ratio=1.0),
        lengths=(5, 6, 7),
        tags=("x", "y"),
        weights={"dense": 0.3},
        mode="b",
        verbose=True,
    )
    assert build(SPEC, {"at": "here"}).extra == _Optional(where="here")  # type: ignore[attr-defined]
    assert build(SPEC, {"secret_key": "k"}).extra is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            {"share": 0.0},
            r"^--share: input should be greater than 0, got 0\.0 \(allowed: \(0, 1\]\)$",
        ),
        ({"depth": 10}, r"^--depth: .* got 10 \(allowed: \[1, 9\]\)$"),
        ({"lengths": "1,x"}, r"^--lengths 'x': input should be a valid integer.*comma-separated"),
        ({"weights": ["dense"]}, r"^--weights 'dense': expected NAME=VALUE"),
        ({"weights": ["dense=-"]}, r"^--weights\[dense\]: input should be a valid number"),
        ({"at": "x", "secret_key": 5}, r"^--secret-key: input should be a valid string$"),
    ],
)
def test_a_refused_value_is_one_line_naming_the_flag(
    given: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        build(SPEC, given)


def test_an_option_name_from_two_models_is_refused() -> None:
    class Twice(BaseModel):
        a: _Inner = Field(default_factory=_Inner, description="One.")
        b: _Inner = Field(default_factory=_Inner, description="Two.")

    with pytest.raises(TypeError, match=r"'depth' comes from both a\.depth and b\.depth"):
        spec_of(Twice)


def test_a_generated_command_runs_with_typer() -> None:
    seen: list[_Args] = []

    @command(_Args)
    def demo(args: _Args) -> None:
        """Demo."""
        seen.append(args)

    import typer

    tiny = typer.Typer()
    tiny.command()(demo)
    tiny.command("other")(lambda: None)
    result = CliRunner().invoke(tiny, ["demo", "-r", "0.25", "--tags", "a", "--verbose"])
    assert result.exit_code == 0, result.output
    assert seen == [_Args(inner=_Inner(ratio=0.25), tags=("a",), verbose=True)]
    shown = CliRunner().invoke(tiny, ["demo", "--help"], env={"COLUMNS": "200"}).output
    assert "How deep." in shown  # its own flag dropped from the front of the description
    assert "--no-verbose" not in shown  # off by default: one flag turns it on


ROOT = Path(__file__).resolve().parent.parent
COMMANDS = [
    (path, command)
    for path, command in walk_commands()
    if not isinstance(command, TyperGroup) and hasattr(command.callback, SPEC_ATTR)
]


def test_every_command_is_built_from_one_model() -> None:
    leaves = {" ".join(p) for p, c in walk_commands() if not isinstance(c, TyperGroup)}
    built = {" ".join(p) for p, _ in COMMANDS}
    assert built == leaves


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_each_option_shows_its_fields_help_and_default(
    path: tuple[str, ...], command: object
) -> None:
    spec: CommandSpec = getattr(command.callback, SPEC_ATTR)  # type: ignore[attr-defined]
    params = {p.name: p for p in command.params}  # type: ignore[attr-defined]
    for leaf in spec.leaves:
        param = params[leaf.param]
        where = f"{' '.join(path)} {leaf.param}"
        longs = [o for o in (*param.opts, *param.secondary_opts) if o.startswith("--")]
        if param.param_type_name != "argument":
            assert leaf.spelled in longs, where
        assert param.help == help_text(leaf.field.description, [leaf.spelled]), where
        if leaf.default is not ... and not leaf.flag.comma:
            assert param.default == leaf.default, where
        # Bounds belong to the field: click enforces none of its own.
        assert (getattr(param, "min", None), getattr(param, "max", None)) == (None, None), where


def test_the_big_command_flattens_its_settings_models() -> None:
    plan = dict(COMMANDS)[("plan",)]
    spec: CommandSpec = getattr(plan.callback, SPEC_ATTR)  # type: ignore[attr-defined]
    paths = {leaf.path for leaf in spec.leaves}
    assert ("request", "max_model_len") in paths
    assert ("request", "reserves", "question_tokens") in paths
    assert ("settings", "prefixes") in paths
    assert len(spec.leaves) >= 40


def test_no_type_ignore_on_choices_in_the_cli() -> None:
    offenders = [
        f"{path.name}:{n}"
        for path in sorted((ROOT / "residency" / "cli").glob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "type: ignore" in line
    ]
    assert offenders == []


def test_help_does_not_repeat_its_own_flag() -> None:
    assert help_text("--max-num-seqs: requests at once.", ["--max-num-seqs"]) == (
        "Requests at once."
    )
    assert help_text("--max-num-seqs.", ["--max-num-seqs"]) == "--max-num-seqs."
    assert help_text("--dtype; vLLM decides.", ["--dtype"]) == "vLLM decides."
    assert help_text("--other: flag.", ["--dtype"]) == "--other: flag."


@pytest.mark.parametrize(
    ("args", "start"),
    [
        pytest.param(("--repeats", "0"), "error: --repeats: ", id="repeats-zero"),
        pytest.param(("--time-budget", "0"), "error: --time-budget: ", id="budget-zero"),
        pytest.param(
            ("--lengths", "512,0"),
            "error: --lengths '0': input should be greater than or equal to 1",
            id="length-zero",
        ),
    ],
)
def test_demo_refuses_a_value_in_one_line_before_it_starts_anything(
    args: tuple[str, ...], start: str, tmp_path: Path
) -> None:
    out = run_cli("demo", "--out", str(tmp_path / "out"), *args)
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(start), lines
    assert not (tmp_path / "out").exists()
