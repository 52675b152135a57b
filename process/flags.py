"""Command-line flags generated from a frozen settings dataclass, so a flag, its type, its default and its
help text cannot drift from the field they set: one `--flag-name` per field, typed from the annotation,
helped by the field's `setting(..., help=, unit=)` metadata."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn


class FlagError(ValueError):
    """A command line that does not parse; the message is one line that names the flag and the fix."""


class FlagParser(argparse.ArgumentParser):
    """An ArgumentParser that raises FlagError instead of printing usage and exiting, and suggests the
    closest flag for a mistyped one (`--max-qeue` -> `--max-queue`)."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments:"):
            known = [option for option in self._option_string_actions if option.startswith("--")]
            hints = []
            for word in message.split(":", 1)[1].split():
                close = difflib.get_close_matches(word.split("=", 1)[0], known, n=1)
                if word.startswith("-") and close:
                    hints.append(f"{word} -> {close[0]}")
            if hints:
                message += f" (did you mean: {', '.join(hints)}?)"
        raise FlagError(f"{message}; see {self.prog} --help")


def setting(default: Any, *, help: str, unit: str = "", shown: str = "") -> Any:
    """A settings field: its default, what it does, the unit its value is counted in, and how the default
    reads in --help when it is not a value (None: "derived" unless `shown` says more)."""
    return dataclasses.field(default=default, metadata={"help": help, "unit": unit, "shown": shown})


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def add_flags(parser: argparse.ArgumentParser, settings_type: type[Any], *, skip: Iterable[str] = ()) -> None:
    """Adds one flag per field of `settings_type` (a dataclass whose fields were made with `setting`), in
    declared_order."""
    hints = typing.get_type_hints(settings_type)
    skipped = set(skip)
    for field in declared_order(settings_type):
        if field.name in skipped:
            continue
        kind, optional = _kind(hints[field.name])
        parser.add_argument(
            flag_name(field.name),
            dest=field.name,
            type=_parser_for(kind, optional, field.name),
            default=field.default,
            metavar=_metavar(kind),
            help=help_text(field),
        )


def declared_order(settings_type: type[Any]) -> list[dataclasses.Field[Any]]:
    """The fields of `settings_type`, the most derived class's first, each class's in its own order: the
    server's Settings lists its own flags before those the admission policies declare for it to inherit
    (a dataclass puts inherited fields first)."""
    fields = {field.name: field for field in dataclasses.fields(settings_type)}
    names = [name for kind in settings_type.__mro__ for name in vars(kind).get("__annotations__", {})]
    return [fields[name] for name in dict.fromkeys(names) if name in fields]


def help_text(field: dataclasses.Field[Any]) -> str:
    text = str(field.metadata.get("help", "")) or field.name.replace("_", " ")
    unit = str(field.metadata.get("unit", ""))
    default = field.default
    if isinstance(default, tuple):
        shown = ",".join(map(str, default)) or "none"
    elif default is None:
        shown = str(field.metadata.get("shown", "")) or "derived"
    else:
        shown = str(default)
    # argparse formats help with %-style: a literal percent sign must be doubled.
    return (f"{text} ({unit}; default: {shown})" if unit else f"{text} (default: {shown})").replace("%", "%%")


def values_from(namespace: argparse.Namespace, settings_type: type[Any]) -> Mapping[str, Any]:
    """The parsed flags of `settings_type`'s fields, ready for `settings_type(**values)`."""
    return {
        f.name: getattr(namespace, f.name)
        for f in dataclasses.fields(settings_type)
        if hasattr(namespace, f.name)
    }


def _kind(annotation: Any) -> tuple[type[Any], bool]:
    """The scalar type a field holds (tuples of str count as str lists), and whether None is allowed."""
    optional = False
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(members) != len(typing.get_args(annotation))
        annotation = members[0]
    if typing.get_origin(annotation) is tuple:
        return tuple, optional
    if annotation not in (int, float, str, bool):
        raise TypeError(f"no flag type for a settings field of type {annotation!r}")
    return annotation, optional


def _parser_for(kind: type[Any], optional: bool, name: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        if optional and text.strip().lower() in ("none", "auto"):
            return None
        if kind is tuple:
            return tuple(part.strip() for part in text.split(",") if part.strip())
        if kind is bool:
            lowered = text.strip().lower()
            if lowered not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                raise argparse.ArgumentTypeError(f"takes true or false, not {text!r}")
            return lowered in ("true", "1", "yes", "on")
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"takes {'an integer' if kind is int else 'a number'}, not {text!r}"
            ) from None

    parse.__name__ = kind.__name__  # argparse names the type in its own messages
    return parse


def _metavar(kind: type[Any]) -> str:
    return {int: "N", float: "X", str: "TEXT", bool: "BOOL", tuple: "A,B"}[kind]
