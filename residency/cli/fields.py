"""Typer options bound to pydantic fields: each flag's help, bounds and default come from one field.

A command declares `Annotated[T, option_from(Model, "name")] = default_of(Model, "name")` with
`T` the field's own type (a `Literal` alias lists the choices once), and builds the model with
`bind(Model, locals())`. The field's description is the help text, its bounds are checked by
`bind` (one line naming the flag, the value and the interval), and `tests/test_cli_fields.py`
checks, for every bound option of every command, that default, type and help are the field's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any, TypeVar

import typer
from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, TypeAdapter, ValidationError
from typer.models import OptionInfo

from residency.errors import ConfigError

BOUND_FIELD = "residency_field"
"""Attribute an `option_from` OptionInfo carries: (model, field name)."""

M = TypeVar("M", bound=BaseModel)


def option_from(model: type[BaseModel], name: str, *param_decls: str, **kwargs: Any) -> OptionInfo:
    """A typer option whose help is the description of `model.name`; `kwargs` add what only
    the command line has (a panel, `show_default`), never a second help text or bound.

    Bounds stay on the field: `bind` checks them, so an out-of-range value is one line with the
    flag, the value and the allowed interval (exit 1), the same for every command."""
    field = model.model_fields[name]
    if kwargs.keys() & {"help", "min", "max"}:
        raise TypeError(f"{model.__name__}.{name}: help and bounds are the field's")
    flags = [d for decl in param_decls for d in decl.split("/") if d.startswith("--")]
    make: Callable[..., OptionInfo] = typer.Option
    info = make(*param_decls, help=help_text(field.description, flags or [flag_of(name)]), **kwargs)
    setattr(info, BOUND_FIELD, (model, name))
    return info


def help_text(description: str | None, flags: list[str]) -> str | None:
    """The field's description without its own flag in front ("--max-num-seqs: how many" reads
    "How many" under --max-num-seqs); kept whole when nothing would follow."""
    if not description:
        return description
    for flag in flags:
        match = re.match(re.escape(flag) + r"[:;,] +(?=\S)", description)
        if match:
            rest = description[match.end() :]
            return rest[0].upper() + rest[1:] if rest[:2].islower() else rest
    return description


def default_of(model: type[BaseModel], name: str) -> Any:
    """The field's default, as the option's default."""
    field = model.model_fields[name]
    if field.is_required():
        raise TypeError(f"{model.__name__}.{name} has no default to give its option")
    return field.get_default(call_default_factory=True)


def flag_of(name: str) -> str:
    """The command-line spelling of a parameter name."""
    return "--" + name.replace("_", "-")


def bind(model: type[M], params: Mapping[str, Any], /, **extra: Any) -> M:
    """`model` built from the command's parameters that share its field names, plus `extra`.

    A value the model refuses becomes one ConfigError line: the flag as the command spells it,
    the value (never a secret's) and the allowed interval; a rule over several fields gives its
    own message."""
    data = {name: params[name] for name in model.model_fields if name in params}
    data.update(extra)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_refusal(model, exc)) from None


def check_fields(model: type[BaseModel], params: Mapping[str, Any], /, *names: str) -> None:
    """Check the command's values of `names` against `model`'s fields alone, where the model
    itself is only built later (a report's settings): the same one line as `bind`."""
    for name in names:
        field = model.model_fields[name]
        spec: Any = Annotated[field.annotation, *field.metadata]
        adapter: TypeAdapter[Any] = TypeAdapter(spec)
        try:
            adapter.validate_python(params[name])
        except ValidationError as exc:
            err = exc.errors()[0]
            err["loc"] = (name,)
            raise ConfigError(_refusal(model, exc, err)) from None


def _refusal(model: type[BaseModel], exc: ValidationError, first: Any = None) -> str:
    err = first or exc.errors()[0]
    msg = str(err["msg"]).removeprefix("Value error, ")
    loc = err["loc"]
    if not loc:  # a model validator: its message names the flags
        return msg
    name = str(loc[0])
    field = model.model_fields.get(name)
    where = _spelled().get(name, flag_of(name)) + "".join(f"[{p}]" for p in loc[1:])
    secret = field is not None and (not field.repr or _SECRET.search(name) is not None)
    got = "" if secret else f", got {err.get('input')!r}"
    span = interval(field.metadata) if field else ""
    return f"{where}: {msg[:1].lower()}{msg[1:]}{got}" + (f" (allowed: {span})" if span else "")


_SECRET = re.compile(r"(^|_)(key|token|secret|password)$", re.IGNORECASE)


def _spelled() -> dict[str, str]:
    """Parameter name -> the flag the running command declares for it (`--pruner-url` for
    `url`); empty outside a command."""
    from typer._click.globals import get_current_context  # typer's own click

    ctx = get_current_context(silent=True)
    if ctx is None:
        return {}
    return {
        p.name: next((o for o in p.opts if o.startswith("--")), p.opts[0])
        for p in ctx.command.params
        if p.name and p.opts
    }


def interval(rules: list[Any]) -> str:
    """A field's numeric bounds as an interval, e.g. "(0, 1]"; empty when it has none."""
    low = next((f"[{r.ge}" for r in rules if isinstance(r, Ge)), None)
    low = low or next((f"({r.gt}" for r in rules if isinstance(r, Gt)), None)
    high = next((f"{r.le}]" for r in rules if isinstance(r, Le)), None)
    high = high or next((f"{r.lt})" for r in rules if isinstance(r, Lt)), None)
    if low is None and high is None:
        return ""
    return f"{low or '(-inf'}, {high or 'inf)'}"
