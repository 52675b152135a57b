"""bench/call_counts.py: the service's main thread counts each Python function it enters and each C function
it calls, exactly, into the counts file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SERVICE = """
import math, time
def step():
    return math.sqrt(4.0)
for _ in range(37):
    step()
time.sleep(1.2)  # two dumps: the counts file holds every call above
"""


def test_the_counts_file_holds_each_call_of_the_main_thread(tmp_path: Path) -> None:
    (tmp_path / "tiny_service.py").write_text(SERVICE)
    counts = tmp_path / "counts.json"
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root), str(root / "protos")])}
    command = ["-m", "bench.call_counts", "--serve", str(counts), "--", "-m", "tiny_service"]
    subprocess.run([sys.executable, *command], env=env, check=True, timeout=120)
    found = json.loads(counts.read_text())
    assert found[f"py:{tmp_path / 'tiny_service.py'}:step"] == 37
    assert found["c:sqrt"] == 37
