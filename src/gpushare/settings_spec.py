"""Settings declared once, on the service's frozen settings struct.

A field that people set carries a :class:`Setting` in its ``Annotated`` type: its flag, its
environment variable, its help and the function that parses (and validates) the text typed
for it. The field's default is the setting's default. From that one declaration this module
derives the argparse parser, the reading of the environment and the rows of
``services/<service>/settings.md`` (``tools/generate_settings.py``).

Flags win over the environment, which wins over the field's default; an empty variable counts
as unset. Text from a flag or from the environment goes through the same parse function, so a
bad value either way exits with usage (status 2) naming the flag.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import PurePath
from typing import Any, Literal, TypeVar

import msgspec

T = TypeVar("T")
Kind = Literal["value", "switch", "negatable", "repeat"]


class SettingsError(ValueError):
    """A setting that cannot be used as given; the message says what to type instead."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Setting:
    """How people set one field: flag, environment variable, help, parser."""

    help: str
    flag: str | None = None
    env: str | None = None
    parse: Callable[[str], Any] = str
    """Text (flag or environment) to value; raises :class:`SettingsError` with its message,
    or ``ValueError`` for argparse's "invalid <parse> value"."""
    kind: Kind = "value"
    """``switch``: a flag without value (the variable is ``true``); ``negatable``:
    ``--x``/``--no-x``; ``repeat``: a tuple, one value per flag (the variable comma-separated)."""
    metavar: str | None = None
    shown_default: str | None = None
    """The default as documented, where the field's own default is computed or opaque."""
    read_env: Callable[[Mapping[str, str]], str | None] | None = None
    """Reads the environment's text itself (several variables); default ``environ[env]``."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Group:
    """A field holding a nested settings struct, built when any of its settings is given."""

    title: str


@dataclasses.dataclass(frozen=True)
class Entry:
    """One declared setting: its field (``group.name`` when nested), declaration and default."""

    name: str
    setting: Setting
    default: Any
    group: str | None = None

    @property
    def dest(self) -> str:
        return f"{self.group}.{self.name}" if self.group else self.name


REQUIRED = object()
"""The default of a field that has none."""


def field_defaults(cls: type) -> dict[str, Any]:
    """Each field's default (``default_factory`` called), or :data:`REQUIRED`."""
    if dataclasses.is_dataclass(cls):
        return {
            f.name: f.default
            if f.default is not dataclasses.MISSING
            else f.default_factory()
            if f.default_factory is not dataclasses.MISSING
            else REQUIRED
            for f in dataclasses.fields(cls)
        }
    return {
        f.name: f.default
        if f.default is not msgspec.NODEFAULT
        else f.default_factory()
        if f.default_factory is not msgspec.NODEFAULT
        else REQUIRED
        for f in msgspec.structs.fields(cls)
    }


def declared(cls: type, group: str | None = None) -> list[Entry]:
    """The settings of ``cls`` (and of its groups), in field order."""
    defaults = field_defaults(cls)
    entries: list[Entry] = []
    for name, hint in typing.get_type_hints(cls, include_extras=True).items():
        for meta in getattr(hint, "__metadata__", ()):
            if isinstance(meta, Setting):
                entries.append(Entry(name, meta, defaults[name], group))
            elif isinstance(meta, Group):
                entries.extend(declared(_group_class(hint), name))
    return entries


def _group_class(hint: Any) -> type:
    (inner, *_) = typing.get_args(hint)
    candidates = [arg for arg in typing.get_args(inner) or (inner,) if arg is not type(None)]
    return typing.cast(type, candidates[0])


def _group_titles(cls: type) -> dict[str, tuple[str, type]]:
    return {
        name: (meta.title, _group_class(hint))
        for name, hint in typing.get_type_hints(cls, include_extras=True).items()
        for meta in getattr(hint, "__metadata__", ())
        if isinstance(meta, Group)
    }


def shown(entry: Entry) -> str:
    """The default as people read it."""
    value = entry.default
    if entry.setting.shown_default is not None:
        return entry.setting.shown_default
    if value is None or value is REQUIRED:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(str(item) for item in value) or "none"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, PurePath):
        return str(value)
    return str(value)


def env_text(setting: Setting, environ: Mapping[str, str]) -> str | None:
    """The environment's text for ``setting``; ``None`` when unset or empty."""
    if setting.read_env is not None:
        return setting.read_env(environ) or None
    return (environ.get(setting.env) or None) if setting.env else None


def _flag_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """``parse`` for argparse: a :class:`SettingsError` keeps its own message."""

    def parse_flag(text: str) -> T:
        try:
            return parse(text)
        except SettingsError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    parse_flag.__name__ = getattr(parse, "__name__", "value")
    return parse_flag


def _help(entry: Entry) -> str:
    setting = entry.setting
    where = f"env {setting.env}; " if setting.env else ""
    return f"{setting.help} ({where}default {shown(entry)})".replace("%", "%%")


def _add(target: Any, entry: Entry, environ: Mapping[str, str]) -> None:
    setting = entry.setting
    text = env_text(setting, environ)
    options: dict[str, Any] = {"dest": entry.dest, "help": _help(entry)}
    if setting.kind == "switch":
        options.update(action="store_true", default=True if text == "true" else argparse.SUPPRESS)
    elif setting.kind == "negatable":
        options.update(action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS)
    else:
        metavar = setting.metavar or str(setting.flag).lstrip("-").replace("-", "_").upper()
        options.update(type=_flag_type(setting.parse), metavar=metavar)
        if setting.kind == "repeat":
            options.update(action="append", default=argparse.SUPPRESS)
        else:  # argparse parses a text default with ``type``, as if it had been typed
            options.update(default=argparse.SUPPRESS if text is None else text)
    target.add_argument(setting.flag, **options)


def build_parser(
    cls: type, *, prog: str, description: str, environ: Mapping[str, str]
) -> argparse.ArgumentParser:
    """The argparse parser of ``cls``'s flags; a flag left out is absent from the result."""
    parser = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    groups = {
        name: parser.add_argument_group(title) for name, (title, _) in _group_titles(cls).items()
    }
    for entry in declared(cls):
        if entry.setting.flag is not None:
            _add(groups[entry.group] if entry.group else parser, entry, environ)
    return parser


def read_settings(
    cls: type[T],
    argv: Sequence[str] | None,
    environ: Mapping[str, str] | None,
    *,
    prog: str,
    description: str = "",
) -> T:
    """``cls`` from flags, then the environment (``os.environ`` when None), then its
    defaults; exits 2 on a bad value."""
    environ = os.environ if environ is None else environ
    parser = build_parser(cls, prog=prog, description=description, environ=environ)
    args = vars(parser.parse_args(argv))
    given: dict[str | None, dict[str, Any]] = {}
    for entry in declared(cls):
        value = args.get(entry.dest, REQUIRED)
        if value is REQUIRED:
            value = _from_environment(parser, entry, environ)
        if value is not REQUIRED:
            kept = tuple(value) if entry.setting.kind == "repeat" else value
            given.setdefault(entry.group, {})[entry.name] = kept
    top = given.pop(None, {})
    for name, (_, group_cls) in _group_titles(cls).items():
        if name in given:
            top[name] = _build_group(parser, group_cls, name, given[name])
    return cls(**top)


def _from_environment(
    parser: argparse.ArgumentParser, entry: Entry, environ: Mapping[str, str]
) -> Any:
    """A setting without its flag: from the environment where that is not argparse's job."""
    setting = entry.setting
    text = env_text(setting, environ)
    if text is None or (setting.flag is not None and setting.kind != "repeat"):
        return REQUIRED
    parts = [part.strip() for part in text.split(",")] if setting.kind == "repeat" else [text]
    try:
        values = [setting.parse(part) for part in parts if part]
    except ValueError as error:
        parser.error(f"{setting.env}={text!r}: {error}")
    return values if setting.kind == "repeat" else values[0]


def _build_group(
    parser: argparse.ArgumentParser, group_cls: type, name: str, values: dict[str, Any]
) -> Any:
    required = [entry for entry in declared(group_cls, name) if entry.default is REQUIRED]
    if any(entry.name not in values for entry in required):
        parser.error(" and ".join(str(entry.setting.flag) for entry in required) + " go together")
    return group_cls(**values)


def run_service(
    parse: Callable[[Sequence[str] | None], T],
    argv: Sequence[str] | None,
    *,
    prog: str,
    start: Callable[[T], int],
) -> int:
    """How every service starts: its settings parsed (flags, environment), then run.

    ``--help`` returns 0; a bad setting returns 2, with argparse's usage or a line saying why.
    """
    try:
        settings = parse(argv)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 2
    except SettingsError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 2
    return start(settings)


def settings_table(cls: type) -> str:
    """The Markdown table of ``cls``'s settings: setting, flag, environment, default, meaning."""
    rows = [
        "| setting | flag | environment | default | description |",
        "|---|---|---|---|---|",
    ]
    for entry in declared(cls):
        setting = entry.setting
        cells = (
            f"`{entry.dest}`",
            f"`{setting.flag}`" if setting.flag else "",
            f"`{setting.env}`" if setting.env else "",
            f"`{shown(entry)}`",
            setting.help.replace("|", "\\|"),
        )
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


# What several settings parse with.


def one_of(*choices: str, fold_case: bool = False) -> Callable[[str], str]:
    """One of ``choices`` (any case when ``fold_case``)."""

    def choice(text: str) -> str:
        value = text.strip().lower() if fold_case else text
        for known in choices:
            if value == (known.lower() if fold_case else known):
                return known
        raise SettingsError(f"{text!r}: give one of {', '.join(choices)}")

    choice.__name__ = "choice"
    return choice


def number(
    kind: Callable[[str], T],
    *,
    low: float | None = None,
    high: float | None = None,
    above: float | None = None,
) -> Callable[[str], T]:
    """``kind(text)`` (``int``, ``float``) within the bounds given."""

    def bounded(text: str) -> T:
        value: Any = kind(text)
        if low is not None and value < low:
            raise SettingsError(f"{text}: must be at least {low:g}")
        if high is not None and value > high:
            raise SettingsError(f"{text}: must be at most {high:g}")
        if above is not None and value <= above:
            raise SettingsError(f"{text}: must be above {above:g}")
        return typing.cast(T, value)

    bounded.__name__ = getattr(kind, "__name__", "number")
    return bounded


def port_or_off(text: str) -> int | None:
    """A port; 0 means none (the service does not serve it)."""
    return int(text) or None
