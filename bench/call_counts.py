"""Python and C calls the event-loop thread makes per Infer: exact counts, which a loaded machine does not
blur as it blurs timings (issue 34, item 4: the loop's per-call work against the plain batcher's).

    python -m bench.call_counts --calls 3200 -- -m server --port 0 --models mlp --plugins bench.eager_mlp
    python -m bench.call_counts --calls 3200 -- -m bench.plain_batcher --port 0 --torch-threads 1

The service runs under this module's `--serve` mode: its main thread (the event loop) counts each Python
function entered (a coroutine counts once per resumption) and each C function called, with sys.setprofile,
and writes the counts to a file every half second. h2load sends the Infer request bench.admission sends
(64 callers: 4 connections x 16 streams), first 640 calls to warm up, then `--calls`; the difference of
the counts over those calls, divided by them, is printed, largest first. The counts per call move a little
with the batch sizes (work done per batch), so compare sides run alike.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import runpy
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from bench.h2load_point import _body, h2load_path
from bench.processes import PYTHON, ChildProcess

DUMP_S = 0.5


def serve(out: Path, module: str, args: list[str]) -> None:
    """Runs `module` as __main__ with its main thread's calls counted into `out`."""
    counts: collections.Counter[str] = collections.Counter()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            path = frame.f_code.co_filename.split("site-packages/")[-1].split("python3.11/")[-1]
            counts[f"py:{path}:{frame.f_code.co_name}"] += 1
        elif event == "c_call":
            counts["c:" + getattr(arg, "__qualname__", str(arg))] += 1

    def dump() -> None:
        while True:
            time.sleep(DUMP_S)
            out.with_suffix(".tmp").write_text(json.dumps(dict(counts)))
            os.replace(out.with_suffix(".tmp"), out)

    threading.Thread(target=dump, daemon=True).start()
    sys.setprofile(profile)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _settled(path: Path) -> dict[str, int]:
    """The counts a few dumps after the load ended (background tasks, such as the memory breaker's
    sampling, keep counting: a fraction of a call per Infer, listed as they are)."""
    time.sleep(DUMP_S * 3)
    counts: dict[str, int] = json.loads(path.read_text())
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.call_counts", description=__doc__)
    parser.add_argument("--calls", type=int, default=3200)
    parser.add_argument("--top", type=int, default=40, help="rows to print")
    parser.add_argument("--serve", help=argparse.SUPPRESS)  # the child's mode: the counts file
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- -m MODULE ARGS (the service)")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if len(command) < 2 or command[0] != "-m":
        raise SystemExit("give the service as -- -m MODULE ARGS")
    if args.serve:
        serve(Path(args.serve), command[1], command[2:])
        return
    if h2load_path() is None:
        raise SystemExit("install h2load (nghttp2-client)")
    with tempfile.TemporaryDirectory() as tmp:
        counts = Path(tmp) / "counts.json"
        child = [PYTHON, "-m", "bench.call_counts", "--serve", str(counts), "--", *command]
        with ChildProcess("service", child) as service:
            port = service.wait_for(r"listening on [^:]+:(\d+)", 120.0).group(1)
            service.wait_for(r"ready", 300.0)
            path, body = _body("h2load-grpc", Path(tmp), "naive", None)
            target = f"http://127.0.0.1:{port}{path}"
            shape = ["-c", "4", "-m", "16", "-H", "content-type: application/grpc", "-H", "te: trailers"]

            def drive(calls: int) -> str:
                run = [h2load_path() or "h2load", "-n", str(calls), *shape, "-d", str(body), target]
                return subprocess.run(run, check=True, capture_output=True, text=True).stdout

            drive(640)
            before = _settled(counts)
            summary = drive(args.calls)
            after = _settled(counts)
    print(next((line for line in summary.splitlines() if line.startswith("status codes:")), summary[-300:]))
    spent = {k: v - before.get(k, 0) for k, v in after.items() if v > before.get(k, 0)}
    python = sum(v for k, v in spent.items() if k.startswith("py:")) / args.calls
    native = sum(v for k, v in spent.items() if k.startswith("c:")) / args.calls
    print(f"per call: {python:.1f} Python calls, {native:.1f} C calls ({args.calls} calls, 64 callers)")
    for key, value in sorted(spent.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"  {value / args.calls:7.2f}  {key}")


if __name__ == "__main__":
    main()
