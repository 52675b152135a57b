"""Runs unchanged tritonclient (2.73.0, from .venv-triton: it needs protobuf < 7) against a server and
prints what it got as one JSON object. It imports nothing of Sluice's: the conformance tests run it as a
subprocess (`.venv-triton/bin/python tests/support/triton_probe.py SCENARIO TARGET INPUT_JSON`).

Scenarios: grpc (the sync client, each call the issue names), aio (tritonclient.grpc.aio), cancel (a
stream cancelled after its first token; prints once the client has cancelled, then waits for a line on
stdin before it exits), http (tritonclient.http, JSON and binary tensors), shm (system shared memory).
"""

from __future__ import annotations

import asyncio
import json
import queue
import sys
from typing import Any

import numpy as np


def _err(exc: Exception) -> dict[str, Any]:
    status = getattr(exc, "status", lambda: None)()
    return {"status": str(status), "message": getattr(exc, "message", lambda: str(exc))()}


def _stream_text(client: Any, g: Any, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    text_input = g.InferInput("text_input", [1], "BYTES")
    text_input.set_data_from_numpy(np.array([prompt.encode()], dtype=object))
    client.async_stream_infer(
        model, [text_input], request_id="stream-1", enable_empty_final_response=True,
        parameters={"max_tokens": max_tokens, "temperature": 0},
    )  # fmt: skip
    pieces, finish, ids = [], "", set()
    while True:
        result, error = answers.get(timeout=60)
        if error is not None:
            client.stop_stream()
            return {"error": _err(error)}
        response = result.get_response()
        ids.add(response.id)
        pieces.append(result.as_numpy("text_output")[0].decode())
        if response.parameters["triton_final_response"].bool_param:
            finish = response.parameters["finish_reason"].string_param
            break
    client.stop_stream()
    return {"pieces": pieces, "finish": finish, "ids": sorted(ids)}


def grpc_scenario(target: str, given: dict[str, Any]) -> dict[str, Any]:
    import tritonclient.grpc as g
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    out: dict[str, Any] = {}
    client = g.InferenceServerClient(target)
    out["live"], out["ready"] = client.is_server_live(), client.is_server_ready()
    out["model_ready"] = client.is_model_ready("mlp")
    out["missing_ready"] = client.is_model_ready("missing")
    out["server_metadata"] = client.get_server_metadata(as_json=True)
    out["metadata"] = client.get_model_metadata("mlp", as_json=True)
    out["config"] = client.get_model_config("mlp", as_json=True)
    out["lm_config"] = client.get_model_config("byte-lm", as_json=True)
    x = np.array(given["x"], dtype=np.float32)
    tensor = g.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("mlp", [tensor], outputs=[g.InferRequestedOutput("y")], request_id="r-1")
    out["y"], out["id"] = result.as_numpy("y").tolist(), result.get_response().id
    # Without raw bytes: the same tensor in typed `contents`, through tritonclient's own generated stub.
    request = service_pb2.ModelInferRequest(model_name="mlp", id="r-2")
    typed = request.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
    typed.contents.fp32_contents.extend(x.reshape(-1).tolist())
    answer = service_pb2_grpc.GRPCInferenceServiceStub(client._channel).ModelInfer(request)
    out["y_contents"] = g.InferResult(answer).as_numpy("y").tolist()
    done: queue.Queue[Any] = queue.Queue()
    client.async_infer("mlp", [tensor], callback=lambda result, error: done.put((result, error)))
    result, error = done.get(timeout=60)
    out["y_async"] = None if error else result.as_numpy("y").tolist()
    out["stream"] = _stream_text(client, g, "byte-lm", given["prompt"], given["max_tokens"])
    # A tensor model on a stream answers each request once, as Triton's non-decoupled models do.
    streamed: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: streamed.put((result, error)))
    client.async_stream_infer("mlp", [tensor], request_id="stream-mlp")
    result, error = streamed.get(timeout=60)
    client.stop_stream()
    out["y_stream"] = _err(error) if error else result.as_numpy("y").tolist()
    # BYTES in, FP32 and INT32 out: the embedding model, two texts in one request.
    texts = g.InferInput("text", [len(given["texts"]), 1], "BYTES")
    texts.set_data_from_numpy(np.array([[t.encode()] for t in given["texts"]], dtype=object))
    wanted = [g.InferRequestedOutput("embedding"), g.InferRequestedOutput("tokens")]
    embedded = client.infer("all-minilm-l6-v2", [texts], outputs=wanted)
    out["embedding"] = embedded.as_numpy("embedding").tolist()
    out["tokens"] = embedded.as_numpy("tokens").tolist()
    out["embedding_datatypes"] = [o.datatype for o in embedded.get_response().outputs]
    for name, call in {
        "wrong_shape": lambda: _infer(client, g, "x", np.zeros((1, 7), np.float32), "FP32"),
        "wrong_datatype": lambda: _infer(client, g, "x", np.zeros((1, 512), np.int32), "INT32"),
        "unknown_input": lambda: _infer(client, g, "z", np.zeros((1, 512), np.float32), "FP32"),
        "missing_model": lambda: _infer(client, g, "x", np.zeros((1, 512), np.float32), "FP32", "missing"),
        "repository": lambda: client.get_model_repository_index(),
        "infer_generate_model": lambda: _infer(
            client, g, "x", np.zeros((1, 512), np.float32), "FP32", "byte-lm"
        ),
    }.items():
        try:
            call()
            out[name] = None
        except Exception as exc:  # tritonclient raises InferenceServerException
            out[name] = _err(exc)
    client.close()
    return out


def _infer(client: Any, g: Any, name: str, array: Any, datatype: str, model: str = "mlp") -> Any:
    tensor = g.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return client.infer(model, [tensor])


def aio_scenario(target: str, given: dict[str, Any]) -> dict[str, Any]:
    import tritonclient.grpc as g
    import tritonclient.grpc.aio as ga

    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with ga.InferenceServerClient(target) as client:
            out["live"] = await client.is_server_live()
            out["model_ready"] = await client.is_model_ready("mlp")
            out["metadata"] = await client.get_model_metadata("mlp", as_json=True)
            x = np.array(given["x"], dtype=np.float32)
            tensor = g.InferInput("x", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            results = await asyncio.gather(*(client.infer("mlp", [tensor]) for _ in range(4)))
            out["ys"] = [r.as_numpy("y").tolist() for r in results]

            async def requests() -> Any:
                text_input = g.InferInput("text_input", [1], "BYTES")
                text_input.set_data_from_numpy(np.array([given["prompt"].encode()], dtype=object))
                yield {
                    "model_name": "byte-lm", "inputs": [text_input], "request_id": "aio-1",
                    "parameters": {"max_tokens": given["max_tokens"], "temperature": 0},
                    "enable_empty_final_response": True,
                }  # fmt: skip

            pieces = []
            async for result, error in client.stream_infer(requests()):
                if error is not None:
                    out["stream_error"] = _err(error)
                    break
                response = result.get_response()
                pieces.append(result.as_numpy("text_output")[0].decode())
                if response.parameters["triton_final_response"].bool_param:
                    break
            out["pieces"] = pieces
        return out

    return asyncio.run(main())


def cancel_scenario(target: str, given: dict[str, Any]) -> dict[str, Any]:
    import tritonclient.grpc as g

    client = g.InferenceServerClient(target)
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    text_input = g.InferInput("text_input", [1], "BYTES")
    text_input.set_data_from_numpy(np.array([b"cancel me"], dtype=object))
    client.async_stream_infer("byte-lm", [text_input], parameters={"max_tokens": given["max_tokens"]})
    result, error = answers.get(timeout=60)
    first = None if error else result.as_numpy("text_output")[0].decode()
    client.stop_stream(cancel_requests=True)
    # A first token's text may be empty (a byte that does not complete a character yet).
    answered = error is None and first is not None
    print(json.dumps({"answered": answered, "error": None if error is None else _err(error)}), flush=True)
    sys.stdin.readline()  # the test reads the server's counters while this client is still connected
    client.close()
    return {}


SCENARIOS = {"grpc": grpc_scenario, "aio": aio_scenario, "cancel": cancel_scenario}


def main() -> None:
    scenario, target, given = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    if scenario in ("http", "shm"):  # in modules of their own, beside this one
        sys.path.insert(0, __file__.rsplit("/", 1)[0])
        module = __import__(f"triton_probe_{scenario}")
        result = module.run(target, given)
    else:
        result = SCENARIOS[scenario](target, given)
    if result:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
