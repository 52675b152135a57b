"""tritonclient.http's scenario for triton_probe.py (run in .venv-triton, imports nothing of Sluice's):
health, metadata, config, and infer with JSON tensors and with the binary tensor extension."""

from __future__ import annotations

from typing import Any

import numpy as np


def _infer(client: Any, http: Any, x: Any, *, binary: bool, request_id: str) -> Any:
    tensor = http.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    output = http.InferRequestedOutput("y", binary_data=binary)
    return client.infer("mlp", [tensor], outputs=[output], request_id=request_id)


def run(target: str, given: dict[str, Any]) -> dict[str, Any]:
    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException

    client = http.InferenceServerClient(target)
    out: dict[str, Any] = {
        "live": client.is_server_live(),
        "ready": client.is_server_ready(),
        "model_ready": client.is_model_ready("mlp"),
        "missing_ready": client.is_model_ready("missing"),
        "server_metadata": client.get_server_metadata(),
        "metadata": client.get_model_metadata("mlp"),
        "config": client.get_model_config("mlp"),
    }
    x = np.array(given["x"], dtype=np.float32)
    binary = _infer(client, http, x, binary=True, request_id="h-1")
    out["y_binary"], out["id"] = binary.as_numpy("y").tolist(), binary.get_response()["id"]
    out["binary_sized"] = "binary_data_size" in binary.get_output("y").get("parameters", {})
    out["y_json"] = _infer(client, http, x, binary=False, request_id="h-2").as_numpy("y").tolist()
    tensor = http.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    out["y_async"] = client.async_infer("mlp", [tensor]).get_result().as_numpy("y").tolist()
    import os

    import tritonclient.utils.shared_memory as shm

    key = f"/sluice-shm-http-{os.getpid()}"  # the anonymous caller's prefix
    region = shm.create_shared_memory_region("http-in", key, x.nbytes)
    try:
        shm.set_shared_memory_region(region, [x])
        client.register_system_shared_memory("http-in", key, x.nbytes)
        out["shm_status"] = client.get_system_shared_memory_status()
        by_reference = http.InferInput("x", list(x.shape), "FP32")
        by_reference.set_shared_memory("http-in", x.nbytes)
        out["y_shm"] = client.infer("mlp", [by_reference]).as_numpy("y").tolist()
        client.unregister_system_shared_memory("http-in")
        out["shm_status_after"] = client.get_system_shared_memory_status()
    finally:
        shm.destroy_shared_memory_region(region)
    try:
        _infer(client, http, np.zeros((1, 3), np.float32), binary=True, request_id="h-3")
        out["wrong_shape"] = None
    except InferenceServerException as exc:
        out["wrong_shape"] = {"status": exc.status(), "message": exc.message()}
    client.close()
    return out
