"""tritonclient's system shared memory scenario for triton_probe.py (run in .venv-triton): a region
registered per tenant, inputs sent by reference, and the refusals (unregistered, foreign, out of bounds)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

MIB = 1024 * 1024


def run(target: str, given: dict[str, Any]) -> dict[str, Any]:
    import tritonclient.grpc as g
    import tritonclient.utils.shared_memory as shm
    from tritonclient.utils import InferenceServerException

    alpha = {"authorization": f"Bearer {given['alpha']}"}
    beta = {"authorization": f"Bearer {given['beta']}"}
    client = g.InferenceServerClient(target)
    out: dict[str, Any] = {}

    def attempt(name: str, call: Any) -> Any:
        try:
            result = call()
        except InferenceServerException as exc:
            out[name] = {"status": str(exc.status()), "message": exc.message()}
            return None
        out[name] = None
        return result

    def by_shm(region: str, size: int, shape: list[int], headers: dict[str, str], offset: int = 0) -> Any:
        tensor = g.InferInput("x", shape, "FP32")
        tensor.set_shared_memory(region, size, offset)
        return client.infer("vector-sum", [tensor], headers=headers).as_numpy("y")

    def by_value(array: Any, headers: dict[str, str]) -> Any:
        tensor = g.InferInput("x", list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        return client.infer("vector-sum", [tensor], headers=headers).as_numpy("y")

    rng = np.random.default_rng(3)
    small = rng.standard_normal((1, MIB)).astype(np.float32)  # 4 MiB
    key = f"/sluice-shm-alpha-test-{os.getpid()}"  # the tenant's own prefix (server/kserve/shm_objects.py)
    region = shm.create_shared_memory_region("in", key, small.nbytes)
    try:
        shm.set_shared_memory_region(region, [small])
        client.register_system_shared_memory("in", key, small.nbytes, headers=alpha)
        status = client.get_system_shared_memory_status(headers=alpha, as_json=True)
        out["status"] = sorted(status.get("regions", {}))
        out["beta_status"] = sorted(
            client.get_system_shared_memory_status(headers=beta, as_json=True).get("regions", {})
        )
        out["y_shm"] = by_shm("in", small.nbytes, [1, MIB], alpha).tolist()
        out["y_value"] = by_value(small, alpha).tolist()
        out["y_local"] = [[float(small.sum())]]
        attempt("foreign", lambda: by_shm("in", small.nbytes, [1, MIB], beta))
        attempt("unregistered", lambda: by_shm("nope", small.nbytes, [1, MIB], alpha))
        attempt("out_of_bounds", lambda: by_shm("in", 1024, [1, 256], alpha, offset=small.nbytes - 512))
        attempt(
            "register_past_end",
            lambda: client.register_system_shared_memory("big", key, 2 * small.nbytes, headers=alpha),
        )
        attempt("register_twice", lambda: client.register_system_shared_memory("in", key, 64, headers=alpha))
        client.unregister_system_shared_memory("in", headers=alpha)
        out["status_after"] = sorted(
            client.get_system_shared_memory_status(headers=alpha, as_json=True).get("regions", {})
        )
        attempt("after_unregister", lambda: by_shm("in", small.nbytes, [1, MIB], alpha))
    finally:
        shm.destroy_shared_memory_region(region)
    large = rng.standard_normal((1, 16 * MIB)).astype(np.float32)  # 64 MiB
    attempt("large_by_value", lambda: by_value(large, alpha))
    region = shm.create_shared_memory_region("large", key + "-large", large.nbytes)
    try:
        shm.set_shared_memory_region(region, [large])
        client.register_system_shared_memory("large", key + "-large", large.nbytes, headers=alpha)
        out["large_y_shm"] = by_shm("large", large.nbytes, [1, 16 * MIB], alpha).tolist()
        out["large_y_local"] = [[float(large.sum())]]
        client.unregister_system_shared_memory(headers=alpha)
    finally:
        shm.destroy_shared_memory_region(region)
    client.close()
    return out
