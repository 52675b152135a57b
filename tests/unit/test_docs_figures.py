"""Issue 36, item 8: every figure the docs give has a command behind it. A table of measurements in
docs/*.md or README.md names, in its section before it, the `bench.<module>` that prints it; every bench
command the docs name is a module whose `--help` runs and knows each flag the docs give it; and the four
figures the issue named point at their commands."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import ROOT

pytestmark = pytest.mark.one_frontend

DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
# A measured value: a number with a unit of time, rate or ratio, or a [low-high] spread.
FIGURE = re.compile(
    r"\d(?:[\d,]*\d)?(?:\.\d+)?\s?(?:ms|us|µs|tokens/s|calls/s|req/s|x\b|%)|\[\d[\d.,]*-\d[\d.,]*\]"
)
COMMAND = re.compile(r"\bbench\.([a-z_][a-z_0-9]*)((?:\s+--[a-z-]+(?:\s+[\w.,=-]+)?)*)")


def sections(path: Path) -> list[tuple[str, list[str]]]:
    """(heading, lines) for each section; fenced code is kept."""
    out: list[tuple[str, list[str]]] = [("", [])]
    fenced = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if line.startswith("#") and not fenced:
            out.append((line, []))
        else:
            out[-1][1].append(line)
    return out


def figure_tables(path: Path) -> list[tuple[str, str, str]]:
    """(heading, the section's text before the table, the table) for each table holding a measurement."""
    found = []
    for heading, lines in sections(path):
        table: list[str] = []
        for index, line in enumerate([*lines, ""]):
            if line.startswith("|"):
                table.append(line)
                continue
            if table and any(FIGURE.search(row) for row in table[2:]):
                before = "\n".join(lines[: index - len(table)])
                found.append((heading, before, "\n".join(table)))
            table = []
    return found


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_each_table_of_figures_names_the_bench_that_prints_it(path: Path) -> None:
    """Named before the table in its section, or in each row holding a figure (a "measured with" column)."""
    for heading, before, table in figure_tables(path):
        if COMMAND.search(heading + before):
            continue
        for row in table.splitlines()[2:]:
            assert not FIGURE.search(row) or COMMAND.search(row), (
                f"{path.name}, {heading!r}: figures with no `bench.<module>` command before the table in "
                f"its section, nor in the row:\n{row[:300]}"
            )


def named_commands() -> dict[str, set[str]]:
    """bench module -> the flags the docs give it."""
    commands: dict[str, set[str]] = {}
    for path in DOCS:
        for module, flags in COMMAND.findall(path.read_text()):
            commands.setdefault(module, set()).update(re.findall(r"--[a-z-]+", flags))
    return commands


# One child runs every module's `--help` in turn (as `python -m bench.X --help` would: run as __main__), so
# torch is imported once, not once a module; it prints {module: [exit code, help text]} as JSON.
_HELPS = """
import contextlib, io, json, runpy, sys
out = {}
for module in sys.argv[1:]:
    sys.argv = [module, "--help"]
    text = io.StringIO()
    try:
        with contextlib.redirect_stdout(text):
            runpy.run_module(f"bench.{module}", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else 1
    out[module] = [code, text.getvalue()]
print(json.dumps(out))
"""


def helps_of(modules: list[str]) -> dict[str, tuple[int, str]]:
    command = [sys.executable, "-c", _HELPS, *modules]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return {module: (code, text) for module, (code, text) in json.loads(done.stdout).items()}


def test_every_bench_command_the_docs_name_runs_its_help_and_knows_its_flags() -> None:
    commands = named_commands()
    assert {"attention", "grammar_engine", "span_cost", "kv_cache", "constrained"} <= commands.keys()
    missing = sorted(m for m in commands if not (ROOT / "bench" / f"{m}.py").exists())
    assert not missing, f"the docs name bench modules that bench/ does not hold: {missing}"
    for module, (code, out) in helps_of(sorted(commands)).items():
        assert code == 0, f"bench.{module} --help exited {code}"
        for flag in commands[module]:
            assert flag in out, f"the docs give bench.{module} {flag}, which its --help does not list"


def section(path: Path, title: str) -> str:
    (text,) = ["\n".join([h, *lines]) for h, lines in sections(path) if h.startswith(f"## {title}")]
    return text


def test_the_four_figures_of_the_issue_point_at_their_commands() -> None:
    assert "bench.attention" in section(ROOT / "docs" / "kv-cache.md", "What was measured")
    assert "bench.grammar_engine" in section(ROOT / "docs" / "constrained.md", "The engine")
    tracing = next(b for b in (ROOT / "README.md").read_text().split("\n- ") if b.startswith("**Traces**"))
    assert "bench.span_cost" in tracing and "us" in tracing
    # The step's 15.2 -> 13.8 ms (CHANGELOG.md): the code that stated it now names the bench that times it.
    step = (ROOT / "server" / "batching" / "step.py").read_text()
    assert "bench.step_gil" in step and "15.2" not in step
