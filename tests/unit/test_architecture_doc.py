"""docs/architecture.md stays true: every folder and module it names, in its text and in its drawing,
exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PATHS = re.compile(r"`((?:[a-z_]+/)+(?:[a-z_]+\.(?:py|md))?)`")  # `server/admission/`, `shim/app.py`
BOX = re.compile(r"┌─ ([a-z]+/)")  # a drawn box: shim/, server/
CELL = re.compile(r"^│( +)((?:[a-z_]+(?:/|\.py) ?)+)")  # its left column: folders and modules


def test_every_named_path_exists() -> None:
    named = set(PATHS.findall(DOC.read_text()))
    assert len(named) > 20, named  # the map names the layout, not three folders
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, missing


def test_every_folder_in_the_drawing_exists_where_it_is_drawn() -> None:
    text = DOC.read_text()
    start = text.index("```") + 3
    drawing = text[start : text.index("```", start)]
    box, parent, checked, missing = "", "", 0, []
    for line in drawing.splitlines():
        if (head := BOX.search(line)) is not None:
            box, parent = head.group(1), ""
            continue
        cell = CELL.match(line.strip(" ").replace(" │ ", "│ ", 1)) if box else None
        if cell is None:
            continue
        nested = len(cell.group(1)) > 1  # indented under the folder above it
        for name in cell.group(2).split():
            path = ROOT / box / (parent if nested else "") / name
            checked += 1
            if not path.exists():
                missing.append(str(path.relative_to(ROOT)))
        if not nested and cell.group(2).split()[0].endswith("/"):
            parent = cell.group(2).split()[0]
    assert checked > 15, checked
    assert not missing, missing
