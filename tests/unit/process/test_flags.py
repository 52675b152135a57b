"""Flags generated from a settings dataclass: one per field, typed, with help naming unit and default."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from process.flags import FlagError, FlagParser, add_flags, setting, values_from


@dataclass(frozen=True, slots=True, kw_only=True)
class Example:
    port: int = setting(8000, help="HTTP port; 0 picks a free one")
    timeout_s: float = setting(2.5, help="how long to wait", unit="seconds")
    models: tuple[str, ...] = setting(("a", "b"), help="models to serve")
    slots: int | None = setting(None, help="slots", unit="requests")
    verbose: bool = setting(False, help="say more")
    name: str = setting("x", help="a name with 90% of the text")


def parse(argv: list[str]) -> Example:
    parser = argparse.ArgumentParser(prog="example", exit_on_error=False)
    add_flags(parser, Example)
    return Example(**values_from(parser.parse_args(argv), Example))


def test_every_field_becomes_a_typed_flag() -> None:
    assert parse([]) == Example()
    parsed = parse(
        ["--port", "0", "--timeout-s", "1", "--models", "m, n", "--slots", "8", "--verbose", "yes"]
    )
    assert parsed == Example(port=0, timeout_s=1.0, models=("m", "n"), slots=8, verbose=True)
    assert parse(["--slots", "auto"]).slots is None
    assert parse(["--models", ""]).models == ()


def test_help_names_the_unit_and_the_default() -> None:
    parser = argparse.ArgumentParser(prog="example")
    add_flags(parser, Example)
    text = parser.format_help()
    assert "how long to wait (seconds; default: 2.5)" in text
    assert "models to serve (default: a,b)" in text
    assert "slots (requests; default: derived)" in text
    assert "90% of the text" in text


def test_a_mistyped_value_names_the_flag() -> None:
    with pytest.raises(argparse.ArgumentError, match="argument --port: takes an integer, not 'eighty'"):
        parse(["--port", "eighty"])


def test_the_flag_parser_raises_one_line_with_a_suggestion() -> None:
    parser = FlagParser(prog="example")
    add_flags(parser, Example)
    with pytest.raises(FlagError) as info:
        parser.parse_args(["--timout-s", "3"])
    assert str(info.value) == (
        "unrecognized arguments: --timout-s 3 (did you mean: --timout-s -> --timeout-s?); see example --help"
    )
    with pytest.raises(FlagError, match="argument --port: takes an integer, not 'x'; see example --help"):
        parser.parse_args(["--port", "x"])


def test_skipped_fields_get_no_flag() -> None:
    parser = argparse.ArgumentParser(prog="example")
    add_flags(parser, Example, skip=("name",))
    assert "--name" not in parser.format_help()
