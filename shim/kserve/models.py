"""A model's v2 metadata and ModelConfig as REST JSON: integers as JSON numbers (protobuf's JSON mapping
would write int64 as strings, which Triton's REST answers do not)."""

from __future__ import annotations

from typing import Any

from sluice.kserve.v2 import grpc_service_pb2 as v2


def metadata_to_json(answer: v2.ModelMetadataResponse) -> dict[str, Any]:
    def tensors(items: Any) -> list[dict[str, Any]]:
        return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in items]

    return {
        "name": answer.name,
        "versions": list(answer.versions),
        "platform": answer.platform,
        "inputs": tensors(answer.inputs),
        "outputs": tensors(answer.outputs),
    }


def config_to_json(config: v2.ModelConfig) -> dict[str, Any]:
    def data_type(value: int) -> str:
        return v2.DataType.Name(value)  # type: ignore[arg-type]

    batching = config.dynamic_batching
    return {
        "name": config.name,
        "platform": config.platform,
        "backend": config.backend,
        "max_batch_size": config.max_batch_size,
        "input": [
            {"name": i.name, "data_type": data_type(i.data_type), "dims": list(i.dims)} for i in config.input
        ],
        "output": [
            {"name": o.name, "data_type": data_type(o.data_type), "dims": list(o.dims)} for o in config.output
        ],
        "dynamic_batching": {
            "priority_levels": batching.priority_levels,
            "default_priority_level": batching.default_priority_level,
        },
        "model_transaction_policy": {"decoupled": config.model_transaction_policy.decoupled},
        "parameters": {key: {"string_value": p.string_value} for key, p in config.parameters.items()},
    }
