"""The caller of bench/kserve_shm.py, run by .venv-triton's interpreter (tritonclient; nothing of Sluice's):
one caller sends the same FLOAT32 input by value and by system shared memory, alternately, and prints the
latencies of each and whether every answer was the same. The region is written once, before the calls,
as a caller that keeps its tensors in shared memory does.

    .venv-triton/bin/python bench/kserve_shm_client.py TARGET MIB CALLS
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import tritonclient.grpc as g
import tritonclient.utils.shared_memory as shm


def main(target: str, mib: int, calls: int) -> dict[str, object]:
    client = g.InferenceServerClient(target)
    x = np.random.default_rng(0).standard_normal((1, mib * 262144)).astype(np.float32)
    key = f"/sluice-shm-bench-{os.getpid()}"  # the anonymous caller's prefix
    region = shm.create_shared_memory_region("bench", key, x.nbytes)
    shm.set_shared_memory_region(region, [x])
    client.register_system_shared_memory("bench", key, x.nbytes)
    by_value = g.InferInput("x", list(x.shape), "FP32")
    by_value.set_data_from_numpy(x)
    by_shm = g.InferInput("x", list(x.shape), "FP32")
    by_shm.set_shared_memory("bench", x.nbytes)
    times: dict[str, list[float]] = {"value": [], "shm": []}
    answers: set[float] = set()
    try:
        for i in range(calls + 2):  # the first pair warms both paths up
            for name, tensor in (
                (("value", by_value), ("shm", by_shm)) if i % 2 else (("shm", by_shm), ("value", by_value))
            ):
                began = time.perf_counter()
                y = client.infer("vector-sum", [tensor]).as_numpy("y")
                if i >= 2:
                    times[name].append((time.perf_counter() - began) * 1000)
                answers.add(float(y[0, 0]))
    finally:
        client.unregister_system_shared_memory("bench")
        shm.destroy_shared_memory_region(region)
        client.close()
    return {"value_ms": times["value"], "shm_ms": times["shm"], "same_answer": len(answers) == 1}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))), flush=True)
