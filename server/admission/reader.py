"""The guarded methods' request deserializer: it reads the model a call names from the raw bytes, lets the
admission policy refuse the call before its body is parsed (its tensors are never decoded), and turns parse
failures into INVALID_ARGUMENT naming the field. It never raises: grpc would answer UNKNOWN.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.descriptor import Descriptor
from google.protobuf.message import DecodeError

from server.admission.devices import DeviceGates
from server.admission.gate import AdmissionGate
from server.codec.wire import find_invalid_utf8, last_string_field
from server.errors import InvalidArgument, RequestTooLarge, SluiceError


@dataclass(frozen=True, slots=True)
class GuardedMethod:
    """One admission-controlled RPC: its request type, a gate per model it serves, and the models that
    another RPC serves (so a call to the wrong one can say which is right)."""

    name: str
    request: Descriptor
    gates: dict[str, AdmissionGate | DeviceGates] = field(default_factory=dict)
    elsewhere: dict[str, str] = field(default_factory=dict)
    # The work a parsed request asks for, in the unit of its gates' service estimate (Generate: max_tokens).
    work_of: Callable[[Any], int] | None = None
    # The request field that names the model, read from the raw bytes (v2 requests: `model_name`).
    model_field_name: str = "model"
    # What admission and the servicer receive instead of the parsed message: an object with `model`,
    # `request_id` and `priority` (a v2 request's view, server/kserve/calls.py); None: the message itself.
    view: Callable[[Any], Any] | None = None

    @property
    def model_field(self) -> int:
        return int(self.request.fields_by_name[self.model_field_name].number)


@dataclass(frozen=True, slots=True)
class Refused:
    """What the deserializer hands the behaviour instead of a request: the refusal to answer with, and the
    model it names (for metric labels; "" when the model is not one this server serves)."""

    error: SluiceError
    model: str


Decide = Callable[[GuardedMethod, str], SluiceError | None]
# A check on the request's size alone, which runs even when its bytes name no model (the byte budget).
Weigh = Callable[[GuardedMethod, str | None, int], SluiceError | None]


def admission_reader(
    method: GuardedMethod,
    deserialize: Callable[[bytes], Any] | None,
    *,
    decide: Decide,
    max_message_bytes: int,
    weigh: Weigh | None = None,
) -> Callable[[bytes], Any]:
    """The deserializer for `method`: a request message, or a Refused."""
    number = method.model_field
    descriptor = method.request

    def read(data: bytes) -> Any:
        if len(data) > max_message_bytes:
            return Refused(
                RequestTooLarge(
                    f"the request is {len(data)} bytes; the limit is {max_message_bytes}",
                    metadata={"size": len(data), "limit": max_message_bytes},
                ),
                "",
            )
        model = last_string_field(data, number)
        if model is not None:  # None: malformed bytes, which the parse below names
            refusal = decide(method, model)
            if refusal is not None:
                served = model in method.gates or model in method.elsewhere
                return Refused(refusal, model if served else "")
        if weigh is not None and (over := weigh(method, model, len(data))) is not None:
            return Refused(over, model if model is not None and model in method.gates else "")
        parsed = parse(data)
        return parsed if view is None or isinstance(parsed, Refused) else view(parsed)

    parse = parsing_reader(deserialize, descriptor)
    view = method.view
    return read


def parsing_reader(
    deserialize: Callable[[bytes], Any] | None, descriptor: Descriptor | None
) -> Callable[[bytes], Any]:
    """A deserializer that hands the behaviour a Refused(INVALID_ARGUMENT) instead of raising on bytes that
    do not parse (grpc would answer UNKNOWN); for every method, guarded or not."""

    def parse(data: bytes) -> Any:
        try:
            return deserialize(data) if deserialize else data
        except DecodeError as exc:
            path = find_invalid_utf8(descriptor, data) if descriptor is not None else None
            if path is not None:
                return Refused(InvalidArgument(f"{path} is not valid UTF-8", field=path), "")
            return Refused(InvalidArgument(f"the request could not be parsed: {exc}", field="request"), "")

    return parse
