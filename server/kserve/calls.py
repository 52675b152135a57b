"""V2Call: a parsed ModelInferRequest as admission and the servicer read it. The interceptor reads a call's
`model`, `request_id` and `priority` (server/admission/); a v2 request names them `model_name`, `id` and
`parameters["priority"]`, so this view gives the protocol's fields the names admission knows.

Priority is Triton's: `parameters.priority` is 1 (highest) to `priority_levels` (lowest), 0 the default
level. ModelConfig reports 3 levels with 2 the default, so 1 is HIGH, 0 and 2 NORMAL, 3 and above LOW.
"""

from __future__ import annotations

from sluice.inference.v1 import inference_pb2 as pb
from sluice.kserve.v2 import grpc_service_pb2 as v2

from server.errors import InvalidArgument

PRIORITY_LEVELS = 3
DEFAULT_PRIORITY_LEVEL = 2
_LEVELS: dict[int, pb.Priority.ValueType] = {
    0: pb.PRIORITY_NORMAL,
    1: pb.PRIORITY_HIGH,
    2: pb.PRIORITY_NORMAL,
}


class V2Call:
    """One v2 inference request on its way through admission (also one message of ModelStreamInfer)."""

    __slots__ = ("message",)

    def __init__(self, message: v2.ModelInferRequest) -> None:
        self.message = message

    @property
    def model(self) -> str:
        return self.message.model_name

    @property
    def request_id(self) -> str:
        return self.message.id

    @request_id.setter
    def request_id(self, value: str) -> None:
        self.message.id = value

    @property
    def priority(self) -> pb.Priority.ValueType:
        """Sluice's Priority enum value, for admission's decode_priority."""
        return _LEVELS.get(triton_priority(self.message), pb.PRIORITY_LOW)


def parameter(parameters: object, name: str) -> bool | int | float | str | None:
    """The value of one InferParameter in a parameters map, whichever of its kinds is set."""
    found = parameters.get(name) if hasattr(parameters, "get") else None  # a protobuf map
    if found is None:
        return None
    kind = found.WhichOneof("parameter_choice")
    return None if kind is None else getattr(found, kind)


def triton_priority(message: v2.ModelInferRequest) -> int:
    value = parameter(message.parameters, "priority")
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(
            f"parameters.priority must be an integer >= 0 (1 is the highest of {PRIORITY_LEVELS} levels)",
            field="parameters.priority",
        )
    return value
