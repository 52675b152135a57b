"""The admission reader: a refused call is answered from the model field alone (its tensors are never
parsed), a malformed one is INVALID_ARGUMENT naming the field, and it never raises."""

from __future__ import annotations

import pytest
from sluice.inference.v1 import inference_pb2 as pb

from server.admission.gate import AdmissionGate
from server.admission.reader import GuardedMethod, Refused, admission_reader
from server.errors import Overloaded, SluiceError


def method() -> GuardedMethod:
    return GuardedMethod(
        "Infer",
        pb.InferRequest.DESCRIPTOR,
        {"mlp": AdmissionGate("Infer mlp", slots=1, max_waiting=0)},
        {"lm": "Generate"},
    )


class Counting:
    def __init__(self) -> None:
        self.parsed = 0

    def __call__(self, data: bytes) -> pb.InferRequest:
        self.parsed += 1
        return pb.InferRequest.FromString(data)


def request(model: str) -> bytes:
    tensor = pb.Tensor(name="x", dtype=pb.DATA_TYPE_FLOAT32, shape=[4], raw_contents=b"\0" * 16)
    return pb.InferRequest(model=model, inputs=[tensor]).SerializeToString()


def test_a_refusal_is_decided_from_the_model_field_without_parsing_the_body() -> None:
    parse = Counting()
    seen: list[str] = []

    def decide(_: GuardedMethod, model: str) -> SluiceError | None:
        seen.append(model)
        return Overloaded("full") if model == "mlp" else None

    read = admission_reader(method(), parse, decide=decide, max_message_bytes=1 << 20)
    refused = read(request("mlp"))
    assert isinstance(refused, Refused) and refused.model == "mlp" and refused.error.reason == "QUEUE_FULL"
    assert parse.parsed == 0 and seen == ["mlp"]
    assert isinstance(read(request("other")), pb.InferRequest) and parse.parsed == 1


def test_the_last_model_field_decides_as_protobuf_reads_it() -> None:
    seen: list[str] = []
    read = admission_reader(
        method(), Counting(), decide=lambda _, m: seen.append(m), max_message_bytes=1 << 20
    )
    parsed = read(request("first") + request("mlp"))  # a repeated singular field: the last one wins
    assert seen == ["mlp"] and parsed.model == "mlp"


def test_refusals_are_labelled_only_with_served_models() -> None:
    read = admission_reader(
        method(), Counting(), decide=lambda _, m: Overloaded("x"), max_message_bytes=1 << 20
    )
    assert read(request("made-up")).model == ""
    assert read(request("lm")).model == "lm"  # served, by the other RPC


@pytest.mark.parametrize(
    "raw", [b"\x0a", b"\x0a\x05ml", b"\x12\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", b"\x07"]
)
def test_malformed_bytes_are_invalid_argument(raw: bytes) -> None:
    read = admission_reader(method(), Counting(), decide=lambda *_: None, max_message_bytes=1 << 20)
    refused = read(raw)
    assert isinstance(refused, Refused) and refused.error.code == "INVALID_ARGUMENT", refused


def test_invalid_utf8_names_the_field() -> None:
    read = admission_reader(method(), Counting(), decide=lambda *_: None, max_message_bytes=1 << 20)
    refused = read(b"\x0a\x03mlp\x2a\x02\xff\xfe")  # request_id (field 5) is not UTF-8
    assert isinstance(refused, Refused) and refused.error.metadata["field"] == "request_id"


def test_an_oversize_body_is_refused_before_anything_is_read() -> None:
    parse = Counting()
    read = admission_reader(method(), parse, decide=lambda *_: None, max_message_bytes=10)
    refused = read(request("mlp"))
    assert isinstance(refused, Refused) and refused.error.reason == "REQUEST_TOO_LARGE" and parse.parsed == 0
