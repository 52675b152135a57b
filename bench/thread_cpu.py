"""CPU per call of each thread of a gRPC Infer service under h2load: where a call's CPU goes (event loop,
model thread, grpc's own threads), which a throughput ratio on a shared machine cannot show.

    python -m bench.thread_cpu --callers 64 --duration-s 8 -- python -m server --models mlp ...
    python -m bench.thread_cpu -- python -m bench.plain_batcher --port 0 --torch-threads 1

The service is started with the command after `--` (it must print `listening on HOST:PORT` and a line with
`ready`); h2load drives it with the same Infer request bench.admission sends. Each thread's CPU time is read
from /proc/PID/task over the window and divided by the calls h2load completed in it. Thread names come from
py-spy (`py-spy dump`: Python's own names, e.g. MainThread, model-mlp) where it is installed, else from the
kernel (python, event_engine, ...); threads that start after the dump are listed by their kernel name.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from bench.h2load_point import _body, _command, h2load_path
from bench.points import Window
from bench.processes import ChildProcess

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def python_thread_names(pid: int) -> dict[int, str]:
    """{native thread id: Python thread name}, from py-spy when it is installed; {} otherwise."""
    spy = shutil.which("py-spy")
    if spy is None:
        return {}
    dump = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, check=False)
    return {int(m[1]): m[2] for m in re.finditer(r'^Thread (\d+) \(\w+\): "(.*)"', dump.stdout, re.M)}


def thread_cpu_s(pid: int, names: dict[int, str]) -> dict[str, float]:
    """CPU seconds (user + system) by thread name; pool threads (`asyncio_0`, `asyncio_1`) share one."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        kernel_name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        name = re.sub(r"_\d+$", "_N", names.get(int(tid), kernel_name))
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) * TICK_S
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.thread_cpu", description=__doc__)
    parser.add_argument("--callers", type=int, default=64)
    parser.add_argument("--duration-s", type=float, default=8.0)
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the service's command line")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or h2load_path() is None:
        raise SystemExit("give the service's command after --, and install h2load (nghttp2-client)")
    window = Window(args.warmup_s, args.duration_s, 30.0, 1)
    with ChildProcess("service", command) as service, tempfile.TemporaryDirectory() as tmp:
        port = service.wait_for(r"listening on [^:]+:(\d+)", 120.0).group(1)
        service.wait_for(r"ready", 300.0)
        names = python_thread_names(service.pid)
        log = Path(tmp) / "requests.log"
        request = _body("h2load-grpc", Path(tmp), "naive", None)
        h2load = _command("h2load-grpc", f"127.0.0.1:{port}", args.callers, window, request, log)
        with ChildProcess("h2load", h2load) as client:
            client.wait_for(r"Main benchmark duration is started", window.warmup_s + 60.0)
            t0, before = time.time(), thread_cpu_s(service.pid, names)
            time.sleep(window.duration_s)
            t1, after = time.time(), thread_cpu_s(service.pid, names)
            client.wait_for(r"^requests: ", 120.0)
            client.proc.wait(30.0)
        rows = [line.split() for line in log.read_text().splitlines() if line.strip()]
    ok = sum(1 for began, status, us in rows if t0 <= (int(began) + int(us)) / 1e6 < t1 and status == "200")
    print(f"{ok / (t1 - t0):.0f} calls/s at {args.callers} callers; CPU per call by thread, µs:")
    spent = {name: after[name] - before.get(name, 0.0) for name in after}
    for name, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
        if seconds > 0:
            print(f"  {name:32s} {1e6 * seconds / max(ok, 1):8.1f}")
    print(f"  {'all threads':32s} {1e6 * sum(spent.values()) / max(ok, 1):8.1f}")


if __name__ == "__main__":
    main()
