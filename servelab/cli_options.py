"""Command-line options declared once, on a dataclass's fields, and a command's parameters built from them.

A field declared with `option(default, help, *names, ...)` carries its flag names, help text and any further
typer.Option settings in its metadata; `options_from(cls, after=...)` gives a typer command one parameter per
field, so adding an option is adding a field. The field's own type and default stay what Python and pydantic read
(the API and experiment steps validate the same dataclass); where the command line parses something narrower
(`--warmup` is text, the field also takes a number) or gives a different "not given" (`--endpoint`'s None), the
flag says so.

Nothing heavy is imported here: `servelab --help` builds every command's parameters, so the declaration must be
importable in a few milliseconds (typer is imported only when a command is built).
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional, TypeVar

FLAG = "servelab.flag"  # the metadata key a field's Flag is kept under
_FIELD_DEFAULT: Any = object()  # the command's default is the field's

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Flag:
    help: str
    names: tuple[str, ...] = ()  # empty: --the-field-name (and --no-… for a yes/no field)
    parse_as: Any = None  # the type the command line parses, where it is narrower than the field's
    command_default: Any = _FIELD_DEFAULT  # what the command passes when the option is not given
    settings: Mapping[str, Any] = field(default_factory=dict)  # further typer.Option settings (envvar, metavar…)


def option(default: Any, help: str, *names: str, parse_as: Any = None, command_default: Any = _FIELD_DEFAULT,
           **settings: Any) -> Any:
    """A dataclass field that is also a command-line option (typed `Any` so a field may be declared with it)."""
    return field(default=default, metadata={FLAG: Flag(help=help, names=names, parse_as=parse_as,
                                                       command_default=command_default, settings=settings)})


def flag_of(f: dataclasses.Field) -> Flag:
    flag = f.metadata.get(FLAG)
    if flag is None:
        raise TypeError(f"the option field '{f.name}' declares no command-line flag: declare it with option(...)")
    return flag


def declared_options(cls: type) -> list[tuple[dataclasses.Field, Flag, Any, Any]]:
    """Each field of `cls` as (field, flag, the type the command line parses, the command's default)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        flag = flag_of(f)
        parsed = flag.parse_as if flag.parse_as is not None else hints[f.name]
        default = f.default if flag.command_default is _FIELD_DEFAULT else flag.command_default
        out.append((f, flag, _optional_spelt_out(parsed) if default is None else parsed, default))
    return out


def options_from(cls: type, *, after: str) -> Callable[[F], F]:
    """Give the decorated command one keyword parameter per field of `cls`, placed after its parameter `after`;
    the command receives them in its `**kwargs`. (typer reads a command's parameters from its signature.)"""

    def decorate(command: F) -> F:
        import typer

        own = [p for p in inspect.signature(command, eval_str=True).parameters.values()
               if p.kind is not inspect.Parameter.VAR_KEYWORD]
        names = [p.name for p in own]
        generated = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                       annotation=typing.Annotated[parsed, typer.Option(*flag.names, help=flag.help,
                                                                                        **flag.settings)])
                     for f, flag, parsed, default in declared_options(cls)]
        clash = set(names) & {p.name for p in generated}
        if clash:
            raise TypeError(f"{command.__name__} declares {', '.join(sorted(clash))} itself and in {cls.__name__}")
        cut = names.index(after) + 1
        params = [*own[:cut], *generated, *(_keyword_only(p) for p in own[cut:])]
        command.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
        return command

    return decorate


def _keyword_only(p: inspect.Parameter) -> inspect.Parameter:
    return p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if p.default is not inspect.Parameter.empty else p


def _optional_spelt_out(hint: Any) -> Any:
    """`int | None` as Optional[int], the spelling every typer reads."""
    args = typing.get_args(hint)
    if (typing.get_origin(hint) in (typing.Union, types.UnionType)) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return Optional[rest[0]] if len(rest) == 1 else hint
    return hint if hint is type(None) else Optional[hint]
