"""The v2 RPCs that admission guards: ModelInfer shares the Infer models' gates, ModelStreamInfer every
model's (a Generate model's messages stream tokens, a tensor model's get one answer each, as Triton's
non-decoupled models do), so a v2 call and a call on Sluice's own API wait in the same queue by priority."""

from __future__ import annotations

from collections.abc import Mapping

from sluice.kserve.v2 import grpc_service_pb2 as v2

from server.admission.devices import DeviceGates
from server.admission.gate import AdmissionGate
from server.admission.reader import GuardedMethod
from server.kserve.calls import V2Call

SERVICE = v2.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
MODEL_INFER = f"/{SERVICE}/ModelInfer"
MODEL_STREAM_INFER = f"/{SERVICE}/ModelStreamInfer"
Gates = Mapping[str, AdmissionGate | DeviceGates]


def _max_tokens(call: V2Call) -> int:
    found = call.message.parameters.get("max_tokens")
    return found.int64_param or found.uint64_param if found is not None else 0


def kserve_methods(infer_gates: Gates, generate_gates: Gates) -> dict[str, GuardedMethod]:
    request = v2.ModelInferRequest.DESCRIPTOR
    return {
        MODEL_INFER: GuardedMethod(
            "ModelInfer",
            request,
            dict(infer_gates),
            dict.fromkeys(generate_gates, "ModelStreamInfer"),
            model_field_name="model_name",
            view=V2Call,
        ),
        MODEL_STREAM_INFER: GuardedMethod(
            "ModelStreamInfer",
            request,
            {**infer_gates, **generate_gates},
            {},
            work_of=_max_tokens,
            model_field_name="model_name",
            view=V2Call,
        ),
    }
