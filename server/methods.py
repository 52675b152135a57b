"""The Sluice InferenceService RPCs that admission guards (Infer, Generate, Tokenize, Detokenize) beside the
KServe v2 ones (server/kserve/methods.py): each names its request message and its models' gates, and a model
served by another RPC is named in the refusal.

Tokenize and Detokenize pass the same policies as Generate (token, lifecycle, model, tenant, memory, queue,
bytes) but hold a slot of a gate of their own per model: a count of a prompt's tokens holds its slot for one
tokenizer call, and should not wait behind long generations for one of theirs."""

from __future__ import annotations

from sluice.inference.v1 import inference_pb2 as pb

from server.admission.devices import DeviceGates
from server.admission.gate import AdmissionGate
from server.admission.reader import GuardedMethod
from server.kserve.methods import kserve_methods

SERVICE = pb.DESCRIPTOR.services_by_name["InferenceService"].full_name
INFER = f"/{SERVICE}/Infer"
GENERATE = f"/{SERVICE}/Generate"
TOKENIZE = f"/{SERVICE}/Tokenize"
DETOKENIZE = f"/{SERVICE}/Detokenize"


def _max_tokens(request: pb.GenerateRequest) -> int:
    return request.sampling.max_tokens


def guarded_methods(
    infer_gates: dict[str, AdmissionGate | DeviceGates],
    generate_gates: dict[str, AdmissionGate | DeviceGates],
) -> dict[str, GuardedMethod]:
    """Every guarded method by its path, with the models' gates (empty until the models are installed)."""
    return (
        {
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
        }
        | _tokenizer_methods(infer_gates, generate_gates)
        | kserve_methods(infer_gates, generate_gates)
    )


def _tokenizer_methods(
    infer_gates: dict[str, AdmissionGate | DeviceGates],
    generate_gates: dict[str, AdmissionGate | DeviceGates],
) -> dict[str, GuardedMethod]:
    """Tokenize and Detokenize, sharing one gate per generative model, as many slots and waiters as its
    Generate gate (every device's: any replica's tokenizer is the model's)."""
    gates: dict[str, AdmissionGate | DeviceGates] = {
        name: AdmissionGate(f"Tokenize {name}", slots=gate.slots, max_waiting=gate.max_waiting)
        for name, gate in generate_gates.items()
    }
    elsewhere = dict.fromkeys(infer_gates, "Infer")
    return {
        TOKENIZE: GuardedMethod("Tokenize", pb.TokenizeRequest.DESCRIPTOR, gates, elsewhere),
        DETOKENIZE: GuardedMethod("Detokenize", pb.DetokenizeRequest.DESCRIPTOR, gates, elsewhere),
    }
