"""The Sluice InferenceService RPCs that admission guards (Infer, Generate) beside the KServe v2 ones
(server/kserve/methods.py): each names its request message and its models' gates, and a model served by the
other RPC is named in the refusal."""

from __future__ import annotations

from sluice.inference.v1 import inference_pb2 as pb

from server.admission.devices import DeviceGates
from server.admission.gate import AdmissionGate
from server.admission.reader import GuardedMethod
from server.kserve.methods import kserve_methods

SERVICE = pb.DESCRIPTOR.services_by_name["InferenceService"].full_name
INFER = f"/{SERVICE}/Infer"
GENERATE = f"/{SERVICE}/Generate"


def _max_tokens(request: pb.GenerateRequest) -> int:
    return request.sampling.max_tokens


def guarded_methods(
    infer_gates: dict[str, AdmissionGate | DeviceGates],
    generate_gates: dict[str, AdmissionGate | DeviceGates],
) -> dict[str, GuardedMethod]:
    """Every guarded method by its path, with the models' gates (empty until the models are installed)."""
    return {
        INFER: GuardedMethod(
            "Infer", pb.InferRequest.DESCRIPTOR, infer_gates, dict.fromkeys(generate_gates, "Generate")
        ),
        GENERATE: GuardedMethod(
            "Generate",
            pb.GenerateRequest.DESCRIPTOR,
            generate_gates,
            dict.fromkeys(infer_gates, "Infer"),
            work_of=_max_tokens,
        ),
    } | kserve_methods(infer_gates, generate_gates)
