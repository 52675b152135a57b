"""A large input by system shared memory against the same by value (issue 21, acceptance 3): tritonclient
sends a FLOAT32 input of --mib MiB to `vector-sum` (the test plugin's sum of a vector, no other work),
alternating the two ways on one connection; rows give p50 and p99 of each, the p50 ratio, and whether
every answer was the same. The server takes messages up to twice the input, so by value fits.

    flock /tmp/sluice-bench.lock .venv/bin/python -m bench.kserve_shm --mib 4 --calls 60 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import subprocess

from bench import plot
from bench.processes import REPO_ROOT
from bench.stack import SluiceServer
from bench.stats import Spread, percentile

TRITON_PY = REPO_ROOT / ".venv-triton" / "bin" / "python"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mib", type=int, default=4)
    parser.add_argument("--calls", type=int, default=60, help="calls of each kind per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not TRITON_PY.exists():
        raise SystemExit(f"{TRITON_PY} is missing: bash scripts/setup_triton.sh")
    limit = str(2 * args.mib * 1024 * 1024)
    server = SluiceServer(
        "--plugins", "tests.support.faulty_models", "--models", "vector-sum", "--max-message-bytes", limit,
        "--kserve-shm", "true",
    )  # fmt: skip
    runs = []
    try:
        for _ in range(args.repeats):
            command = [str(TRITON_PY), str(REPO_ROOT / "bench" / "kserve_shm_client.py"), server.target]
            command += [str(args.mib), str(args.calls)]
            done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=True)
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    finally:
        server.stop()
    value = [percentile(r["value_ms"], 50) for r in runs]
    shared = [percentile(r["shm_ms"], 50) for r in runs]
    print(f"{args.mib} MiB FLOAT32 input, {args.calls} calls of each kind x {args.repeats} repeats")
    print(f"  by value       p50 {Spread.of(value).format(2)} ms, p99 "
          f"{Spread.of([percentile(r['value_ms'], 99) for r in runs]).format(2)} ms")  # fmt: skip
    print(f"  shared memory  p50 {Spread.of(shared).format(2)} ms, p99 "
          f"{Spread.of([percentile(r['shm_ms'], 99) for r in runs]).format(2)} ms")  # fmt: skip
    ratios = [v / s for v, s in zip(value, shared, strict=True)]
    print(f"  p50 by value / by shared memory: {Spread.of(ratios).format(2)}")
    print(f"  same answer every call: {all(r['same_answer'] for r in runs)}")
    series = {"by value": {args.mib: value}, "shared memory": {args.mib: shared}}
    panel = plot.Panel(f"p50 of a {args.mib} MiB input", "ms", series, log_x=False)
    plot.draw(
        "kserve_shm", [panel], x_label="MiB", title="System shared memory against by value (tritonclient)"
    )


if __name__ == "__main__":
    main()
