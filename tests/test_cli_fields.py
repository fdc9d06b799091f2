"""Every option bound to a pydantic field (`residency.cli.fields.option_from`) shows that field's
help, bounds, type and default — one source per flag — and a refused value names its flag."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, Field
from residency_cli import run_cli
from typer.core import TyperGroup
from typer.models import OptionInfo

from residency.cli import walk_commands
from residency.cli.fields import BOUND_FIELD, bind, default_of, flag_of, help_text, option_from
from residency.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def _callbacks() -> Iterator[tuple[str, Callable[..., Any]]]:
    for path, command in walk_commands():
        if path and command.callback is not None and not isinstance(command, TyperGroup):
            yield " ".join(path), command.callback


COMMANDS = dict(_callbacks())


def _bound(callback: Callable[..., Any]) -> Iterator[tuple[str, Any, OptionInfo, Any]]:
    hints = typing.get_type_hints(callback, include_extras=True)
    defaults = {name: p.default for name, p in inspect.signature(callback).parameters.items()}
    for name, hint in hints.items():
        if typing.get_origin(hint) is not Annotated:
            continue
        base, *meta = typing.get_args(hint)
        for info in meta:
            if isinstance(info, OptionInfo) and hasattr(info, BOUND_FIELD):
                yield name, base, info, defaults[name]


def test_commands_are_found() -> None:
    assert {"plan", "serve", "index", "warm", "bench", "eval coverage"} <= set(COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_bound_options_are_their_fields(command: str) -> None:
    for name, base, info, default in _bound(COMMANDS[command]):
        model, field_name = getattr(info, BOUND_FIELD)
        field = model.model_fields[field_name]
        where = f"{command} {name} -> {model.__name__}.{field_name}"
        decls = [info.default, *info.param_decls]  # typer.Option's first positional is default
        flags = [d for x in decls if isinstance(x, str) for d in x.split("/") if d[:2] == "--"]
        assert info.help == help_text(field.description, flags or [flag_of(name)]), where
        # A required field may be an optional flag: the whole model is then optional (--qdrant).
        types = {field.annotation} | ({field.annotation | None} if field.is_required() else set())
        assert base in types, f"{where}: {base} != {field.annotation}"
        if not field.is_required():
            assert default == default_of(model, field_name), where
        assert (info.min, info.max) == (None, None), f"{where}: bounds belong to the field"


def test_the_big_commands_bind_their_flags() -> None:
    counts = {c: len(list(_bound(COMMANDS[c]))) for c in ("serve",)}
    assert counts["serve"] >= 10, counts


def test_no_type_ignore_on_choices_in_the_cli() -> None:
    offenders = [
        f"{path.name}:{n}"
        for path in sorted((ROOT / "residency" / "cli").glob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "type: ignore" in line
    ]
    assert offenders == []


class _Demo(BaseModel):
    depth: int = Field(default=3, ge=1, le=9, description="How deep.")
    ratio: float = Field(default=0.5, gt=0, le=1, description="A share in (0, 1].")


def test_option_from_takes_its_help_from_the_field() -> None:
    info = option_from(_Demo, "depth", "--depth")
    assert (info.help, info.min, info.max) == ("How deep.", None, None)
    with pytest.raises(TypeError, match="the field's"):
        option_from(_Demo, "depth", help="another text")
    with pytest.raises(TypeError, match="the field's"):
        option_from(_Demo, "depth", min=0)
    with pytest.raises(KeyError):
        option_from(_Demo, "nope")


def test_help_does_not_repeat_its_own_flag() -> None:
    assert help_text("--max-num-seqs: requests at once.", ["--max-num-seqs"]) == (
        "Requests at once."
    )
    assert help_text("--max-num-seqs.", ["--max-num-seqs"]) == "--max-num-seqs."
    assert help_text("--dtype; vLLM decides.", ["--dtype"]) == "vLLM decides."
    assert help_text("--other: flag.", ["--dtype"]) == "--other: flag."


def test_bind_names_the_flag_and_the_value() -> None:
    assert bind(_Demo, {"depth": 4, "ratio": 1.0, "unrelated": "x"}) == _Demo(depth=4, ratio=1.0)
    with pytest.raises(
        ConfigError, match=r"^--ratio: .*greater than 0, got 0\.0 \(allowed: \(0, 1\]\)$"
    ):
        bind(_Demo, {"depth": 4, "ratio": 0.0})


@pytest.mark.parametrize(
    ("args", "start"),
    [
        pytest.param(("--repeats", "0"), "error: --repeats: ", id="repeats-zero"),
        pytest.param(("--time-budget", "0"), "error: --time-budget: ", id="budget-zero"),
        pytest.param(("--lengths", "512,0"), "error: --lengths[1]: ", id="length-zero"),
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
