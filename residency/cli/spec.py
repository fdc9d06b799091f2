"""Commands built from one pydantic model each: the model's fields are the command's options.

A command is `@command(Args)` over `def name(args: Args) -> None`, where `Args` is a pydantic
model. Every field of `Args` is an option, and the fields of a nested model (`cache:
CacheSettings`) are options too, flattened, so the settings models the library already takes
are the command line: the flag, the type (a `Literal` lists the choices), the bounds, the default
and the help (the field's description) are written once, on the field. `Flag(...)` in a field's
`Annotated` metadata gives what only the command line has (another spelling, a short name, a help
panel, an environment variable); `Section(...)` on a nested-model field does the same for the
fields of a model that cannot carry CLI metadata itself (the pure `planner` package's).

The typer signature is generated from the model; the values come back as one model, validated
once: a value out of bounds is one `ConfigError` line naming the flag, the value and the interval
(the flag as the command spells it, never a secret's value).

    class GreetArgs(BaseModel):
        times: Annotated[int, Flag("-n")] = Field(default=1, ge=1, description="How often.")

    @command(GreetArgs)
    def greet(args: GreetArgs) -> None:
        \"\"\"Greet.\"\"\"
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect
import re
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

import typer
from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from residency.errors import ConfigError
from residency.flags import Flag, Section

M = TypeVar("M", bound=BaseModel)
SPEC_ATTR = "residency_spec"
"""Attribute of a generated command callback: its `CommandSpec`."""


@dataclass(frozen=True)
class Leaf:
    """One option: where its value goes in the model and how the command line shows it."""

    path: tuple[str, ...]
    param: str
    field: FieldInfo
    owner: type[BaseModel]
    annotation: Any
    default: Any
    flag: Flag
    optional_parent: tuple[str, ...] | None
    required: bool  # required in its own model (an optional parent is absent without it)

    @property
    def spelled(self) -> str:
        """The flag as the command line spells it (its first long name)."""
        longs = [d for decl in self.flag.decls for d in decl.split("/") if d.startswith("--")]
        return longs[0] if longs else flag_of(self.param)


@dataclass(frozen=True)
class CommandSpec:
    """A command's model and its options."""

    model: type[BaseModel]
    leaves: tuple[Leaf, ...]


def flag_of(name: str) -> str:
    """The command-line spelling of a parameter name."""
    return "--" + name.replace("_", "-")


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


def _meta(info: FieldInfo, kind: type[Any]) -> Any:
    return next((m for m in info.metadata if isinstance(m, kind)), None)


def _flag(info: FieldInfo) -> Flag | None:
    """The field's `Flag`; a shared declaration's (`JsonOutput`) with the panel the field adds
    (`Annotated[JsonOutput, Flag(panel=...)]`)."""
    flags = [m for m in info.metadata if isinstance(m, Flag)]
    if len(flags) < 2:
        return flags[0] if flags else None
    first, panel = flags[0], next((f.panel for f in flags if f.panel), None)
    facts = {f.name: getattr(first, f.name) for f in dataclasses.fields(first)}
    return Flag(*facts.pop("decls"), **{**facts, "panel": panel})


def _nested_model(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """(the BaseModel a field holds, whether it may be None)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1 and isinstance(args[0], type) and issubclass(args[0], BaseModel):
            return args[0], len(args) < len(typing.get_args(annotation))
    return None, False


def _cli_type(annotation: Any) -> Any:
    """The type typer parses: a tuple or list of X becomes a repeatable option of X, a dict a
    repeatable NAME=VALUE option."""
    origin = typing.get_origin(annotation)
    if annotation in (dt.date, dt.datetime):  # parsed by the field, in its own words
        return str
    if origin is dict:
        return list[str]
    if origin is tuple and Ellipsis not in typing.get_args(annotation):
        # A fixed-length tuple: one option taking that many values (choices checked by the field).
        items = [str if typing.get_origin(a) is Literal else a for a in typing.get_args(annotation)]
        return types.GenericAlias(tuple, tuple(items))
    if origin in (tuple, list):
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        item = args[0] if args else str
        if typing.get_origin(item) is Annotated:  # bounds stay with the field
            item = typing.get_args(item)[0]
        if typing.get_origin(item) is Literal:  # choices checked by the field, in its own words
            item = str
        return types.GenericAlias(list, (item,))
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) == 1 and (
            typing.get_origin(members[0]) in (tuple, list, dict)
            or members[0] in (dt.date, dt.datetime)
        ):
            return _cli_type(members[0]) | None
    return annotation


def _default_of(info: FieldInfo, parent_default: Any, name: str) -> Any:
    if parent_default is not None and hasattr(parent_default, name):
        value = getattr(parent_default, name)
    elif info.is_required():
        return ...
    else:
        value = info.get_default(call_default_factory=True)
    if isinstance(value, tuple):
        return list(value) or None
    return value


def _walk(
    model: type[BaseModel],
    path: tuple[str, ...],
    section: Section | None,
    parent_default: Any,
    optional_parent: tuple[str, ...] | None,
) -> Iterator[Leaf]:
    for name, info in model.model_fields.items():
        if section is not None and name in section.skip:
            continue
        here = (*path, name)
        nested, optional = _nested_model(info.annotation)
        if nested is not None:
            inner = _meta(info, Section) or Section()
            if inner.panel is None and section is not None:
                inner = Section(section.panel, inner.panels, inner.flags, inner.skip)
            default = None
            # A factory other than the model itself may set other values (`ServeSettings(plan=
            # ...)`); the model itself holds its fields' defaults, read without building it
            # (building a model's validator at import would slow every --help).
            if not info.is_required() and info.default_factory is not nested:
                default = info.get_default(call_default_factory=True)
            yield from _walk(nested, here, inner, default, here if optional else optional_parent)
            continue
        flag = _flag(info)
        if flag is None and section is not None:
            flag = section.flags.get(name)
        flag = flag or Flag()
        panel = flag.panel
        if panel is None and section is not None:
            panel = section.panels.get(name, section.panel)
        flag = Flag(
            *flag.decls,
            panel=panel,
            show_default=flag.show_default,
            envvar=flag.envvar,
            comma=flag.comma,
            argument=flag.argument,
            metavar=flag.metavar,
        )
        default = _default_of(info, parent_default, name)
        annotation = _cli_type(info.annotation)
        if flag.comma:  # "2000,8000": one text value, split in `_nest`
            annotation = str | None
            default = ",".join(map(str, default)) if isinstance(default, list) else None
        if default is ... and optional_parent is not None:
            default = None  # the whole optional model is absent until this is given
            annotation = annotation | None
        longs = [d for decl in flag.decls for d in decl.split("/") if d.startswith("--")]
        param = longs[0].removeprefix("--").replace("-", "_") if longs else name
        yield Leaf(
            here, param, info, model, annotation, default, flag, optional_parent, info.is_required()
        )


def spec_of(model: type[BaseModel]) -> CommandSpec:
    """Every option of `model`, nested models flattened; a parameter name twice is a bug."""
    leaves = tuple(_walk(model, (), None, None, None))
    seen: dict[str, tuple[str, ...]] = {}
    for leaf in leaves:
        if leaf.param in seen:
            raise TypeError(
                f"{model.__name__}: option {leaf.param!r} comes from both "
                f"{'.'.join(seen[leaf.param])} and {'.'.join(leaf.path)}"
            )
        seen[leaf.param] = leaf.path
    return CommandSpec(model, leaves)


def _is_date(annotation: Any) -> bool:
    """``date`` or ``date | None`` (datetime alike)."""
    members = (
        typing.get_args(annotation)
        if typing.get_origin(annotation) in (typing.Union, types.UnionType)
        else (annotation,)
    )
    return any(m in (dt.date, dt.datetime) for m in members)


def _option(leaf: Leaf) -> Any:
    flags = [d for decl in leaf.flag.decls for d in decl.split("/") if d.startswith("--")]
    extra: dict[str, Any] = {}
    if leaf.flag.envvar:
        extra["envvar"] = leaf.flag.envvar
    if leaf.flag.metavar:
        extra["metavar"] = leaf.flag.metavar
    elif _is_date(leaf.field.annotation):  # typer reads it as text: say what text
        extra["metavar"] = "<date>"
    decls = leaf.flag.decls
    help_ = help_text(leaf.field.description, flags or [flag_of(leaf.param)])
    if leaf.flag.argument:
        return typer.Argument(help=help_, show_default=leaf.flag.show_default)
    if not decls and leaf.annotation is bool and leaf.default is False:
        decls = (flag_of(leaf.param),)  # off by default: `--x` alone turns it on, no `--no-x`
    return typer.Option(
        *decls,
        help=help_,
        rich_help_panel=leaf.flag.panel,
        show_default=leaf.flag.show_default,
        **extra,
    )


def _nest(spec: CommandSpec, values: Mapping[str, Any]) -> dict[str, Any]:
    """The command's flat values as the model's nested data (unset optional models: None)."""
    data: dict[str, Any] = {}
    absent: set[tuple[str, ...]] = set()
    for leaf in spec.leaves:
        value = values.get(leaf.param)
        if isinstance(value, list) and _holds_dict(leaf.field.annotation):
            value = _pairs(leaf, value) or None
        elif isinstance(value, list):
            value = tuple(value)
        elif leaf.flag.comma and isinstance(value, str):
            value = tuple(part.strip() for part in value.split(",") if part.strip())
        if value is None and leaf.required and leaf.optional_parent is not None:
            absent.add(leaf.optional_parent)
        node = data
        for part in leaf.path[:-1]:
            node = node.setdefault(part, {})
        if value is not None or leaf.field.is_required():
            node[leaf.path[-1]] = value
        elif leaf.field.get_default(call_default_factory=True) is None:
            node[leaf.path[-1]] = None  # an explicit None where the model's default is None
    for path in absent:  # an optional model whose required option was not given
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = None
    return data


def _holds_dict(annotation: Any) -> bool:
    if typing.get_origin(annotation) is dict:
        return True
    return any(typing.get_origin(a) is dict for a in typing.get_args(annotation))


def _pairs(leaf: Leaf, items: list[str]) -> dict[str, str]:
    """NAME=VALUE items as a dict (each VALUE checked by the field)."""
    out: dict[str, str] = {}
    for item in items:
        name, eq, value = (part.strip() for part in item.partition("="))
        if not (name and eq and value):
            raise ConfigError(f"{leaf.spelled} {item!r}: expected NAME=VALUE, e.g. dense=0.3")
        out[name] = value
    return out


def build(spec: CommandSpec, values: Mapping[str, Any]) -> BaseModel:
    """The command's model from its flat option values; a refused value is one ConfigError."""
    try:
        return spec.model.model_validate(_nest(spec, values))
    except ValidationError as exc:
        raise ConfigError(refusal(spec, exc)) from None


def refusal(spec: CommandSpec, exc: ValidationError) -> str:
    """One line for the first error: the flag, what is wrong, the value (not a secret's) and
    the allowed interval; a model-wide rule gives its own message (it names the flags)."""
    err = exc.errors()[0]
    msg = str(err["msg"]).removeprefix("Value error, ")
    loc = tuple(str(p) for p in err["loc"])
    leaf = next((x for x in spec.leaves if loc[: len(x.path)] == x.path), None)
    if leaf is None:
        return msg
    rest = "".join(f"[{p}]" for p in loc[len(leaf.path) :])
    if err["type"] == "value_error" and msg.startswith(repr(err.get("input"))):
        return f"{leaf.spelled} {msg}"  # the rule names the value itself: 'X': expected ...
    secret = not leaf.field.repr or _SECRET.search(leaf.param) is not None
    span = interval(leaf.field.metadata)
    if leaf.flag.comma and rest and not secret:  # one part of "2000,8000" is wrong
        allowed = f" (allowed: {span})" if span else ""
        said = f"{msg[:1].lower()}{msg[1:]}{allowed}; give comma-separated values, e.g. 2000,8000"
        return f"{leaf.spelled} {err.get('input')!r}: {said}"
    got = "" if secret else f", got {err.get('input')!r}"
    return f"{leaf.spelled}{rest}: {msg[:1].lower()}{msg[1:]}{got}" + (
        f" (allowed: {span})" if span else ""
    )


_SECRET = re.compile(r"(^|_)(key|token|secret|password)$", re.IGNORECASE)


def interval(rules: list[Any]) -> str:
    """A field's numeric bounds as an interval, e.g. "(0, 1]"; empty when it has none."""
    low = next((f"[{r.ge}" for r in rules if isinstance(r, Ge)), None)
    low = low or next((f"({r.gt}" for r in rules if isinstance(r, Gt)), None)
    high = next((f"{r.le}]" for r in rules if isinstance(r, Le)), None)
    high = high or next((f"{r.lt})" for r in rules if isinstance(r, Lt)), None)
    if low is None and high is None:
        return ""
    return f"{low or '(-inf'}, {high or 'inf)'}"


def command(model: type[M]) -> Callable[[Callable[[M], Any]], Callable[..., Any]]:
    """A typer command callback whose options are `model`'s fields (see the module doc)."""
    spec = spec_of(model)

    def wrap(run: Callable[[M], Any]) -> Callable[..., Any]:
        def callback(**values: Any) -> Any:
            return run(typing.cast(M, build(spec, values)))

        params = []
        annotations: dict[str, Any] = {}
        for leaf in spec.leaves:
            hint = typing.cast(Any, Annotated)[leaf.annotation, _option(leaf)]
            default = inspect.Parameter.empty if leaf.default is ... else leaf.default
            params.append(
                inspect.Parameter(
                    leaf.param, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hint
                )
            )
            annotations[leaf.param] = hint
        callback.__dict__["__signature__"] = inspect.Signature(params)  # read by inspect
        callback.__annotations__ = annotations
        callback.__name__ = run.__name__
        callback.__qualname__ = run.__qualname__
        callback.__doc__ = run.__doc__
        callback.__module__ = run.__module__
        setattr(callback, SPEC_ATTR, spec)
        return callback

    return wrap
