"""REST v2 <-> the v2 protobuf. A request body is JSON, or (the binary tensor extension) JSON of
`Inference-Header-Content-Length` bytes followed by the tensors whose `parameters.binary_data_size` says
how many bytes each takes, in input order. Every input goes upstream as raw bytes (numpy does the JSON
lists' conversion); an output comes back as JSON `data` or, where asked for, as binary after the JSON."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
from sluice.kserve.v2 import grpc_service_pb2 as v2

from shim.admission.request_body import parse_json
from shim.errors import ShimError
from shim.refusals import invalid_argument
from wire import errors as reasons

HEADER_LENGTH = "inference-header-content-length"
_NUMPY = {
    "BOOL": np.bool_, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16, "FP32": np.float32,
    "FP64": np.float64, "UINT8": np.uint8, "INT8": np.int8, "UINT16": np.uint16, "INT16": np.int16,
    "UINT32": np.uint32, "UINT64": np.uint64,
}  # fmt: skip
_LENGTH = struct.Struct("<I")


def bad_request(message: str) -> ShimError:
    return invalid_argument(message, reason=reasons.INVALID_ARGUMENT)


_bad = bad_request


def split_body(body: bytes, header_length: str | None) -> tuple[dict[str, Any], memoryview]:
    """(the JSON header, the binary part)."""
    if header_length is None:
        size = len(body)
    elif not header_length.isdigit() or int(header_length) > len(body):
        raise _bad(f"Inference-Header-Content-Length {header_length[:32]!r} is not a length within the body")
    else:
        size = int(header_length)
    document = parse_json(body[:size])
    if not isinstance(document, dict):
        raise _bad("the request must be a JSON object")
    return document, memoryview(body)[size:]


def set_parameter(target: Any, name: str, value: Any) -> None:
    """One JSON parameter into a protobuf map of InferParameter."""
    if isinstance(value, bool):
        target[name].bool_param = value
    elif isinstance(value, int):
        target[name].int64_param = value
    elif isinstance(value, float):
        target[name].double_param = value
    elif isinstance(value, str):
        target[name].string_param = value
    else:
        raise _bad(f"parameter {name[:64]!r} must be a boolean, number or string")


def _parameters(document: dict[str, Any], where: str) -> dict[str, Any]:
    parameters = document.get("parameters", {})
    if not isinstance(parameters, dict):
        raise _bad(f"{where}.parameters must be an object")
    return dict(parameters)


def to_raw(data: Any, datatype: str, where: str) -> bytes:
    """A JSON tensor's `data` (flat or nested, row-major) as the raw bytes the protocol sends."""
    if datatype == "BYTES":
        values = np.asarray(data, dtype=object).reshape(-1)
        parts = [v.encode() if isinstance(v, str) else None for v in values]
        if any(p is None for p in parts):
            raise _bad(f"{where}.data of a BYTES tensor must hold strings")
        return b"".join(_LENGTH.pack(len(p)) + p for p in parts if p is not None)
    kind = _NUMPY.get(datatype)
    if kind is None:
        raise _bad(f"{where}.datatype {datatype[:32]!r} is not a v2 datatype")
    try:
        array: np.ndarray[Any, Any] = np.asarray(data, dtype=kind)
    except (ValueError, TypeError, OverflowError) as exc:
        raise _bad(f"{where}.data is not a {datatype} tensor: {str(exc)[:120]}") from None
    return array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()


def infer_request(model: str, document: dict[str, Any], binary: memoryview) -> v2.ModelInferRequest:
    message = v2.ModelInferRequest(model_name=model, id=str(document.get("id", "")))
    parameters = _parameters(document, "request")
    parameters.pop("binary_data_output", None)  # how the shim answers, not the model's business
    for name, value in parameters.items():
        set_parameter(message.parameters, name, value)
    inputs = document.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise _bad("inputs must be a non-empty list")
    at = 0
    for index, spec in enumerate(inputs):
        where = f"inputs[{index}]"
        if not isinstance(spec, dict):
            raise _bad(f"{where} must be an object")
        tensor_name, datatype, shape = spec.get("name"), spec.get("datatype"), spec.get("shape")
        if not isinstance(tensor_name, str) or not isinstance(datatype, str):
            raise _bad(f"{where} needs a name and a datatype")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) for d in shape
        ):
            raise _bad(f"{where}.shape must be a list of integers")
        tensor = message.inputs.add(name=tensor_name, datatype=datatype, shape=shape)
        tensor_parameters = _parameters(spec, where)
        size = tensor_parameters.pop("binary_data_size", None)
        for key, value in tensor_parameters.items():
            set_parameter(tensor.parameters, key, value)
        if "shared_memory_region" in tensor_parameters:
            continue
        if size is not None:
            if not isinstance(size, int) or size < 0 or at + size > len(binary):
                raise _bad(f"{where}.parameters.binary_data_size passes the end of the binary data")
            message.raw_input_contents.append(bytes(binary[at : at + size]))
            at += size
        elif "data" in spec:
            message.raw_input_contents.append(to_raw(spec["data"], datatype, where))
        else:
            raise _bad(f"{where} has no data, binary_data_size or shared_memory_region")
    if at != len(binary):
        raise _bad(f"{len(binary) - at} bytes of binary data follow the inputs; none is named by them")
    outputs = document.get("outputs", [])
    if not isinstance(outputs, list):
        raise _bad("outputs must be a list")
    for index, spec in enumerate(outputs):
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise _bad(f"outputs[{index}] needs a name")
        output = message.outputs.add(name=spec["name"])
        output_parameters = _parameters(spec, f"outputs[{index}]")
        output_parameters.pop("binary_data", None)
        for key, value in output_parameters.items():
            set_parameter(output.parameters, key, value)
    return message


def binary_outputs_of(document: dict[str, Any]) -> tuple[dict[str, bool], bool]:
    """Per requested output, whether it is answered as binary (its `binary_data`, else the request's
    `binary_data_output`), and that default for the outputs not named."""
    default = bool(_parameters(document, "request").get("binary_data_output", False))
    named = {
        spec["name"]: bool(_parameters(spec, "outputs").get("binary_data", default))
        for spec in document.get("outputs", [])
        if isinstance(spec, dict) and isinstance(spec.get("name"), str)
    }
    return named, default


def infer_response(
    response: v2.ModelInferResponse, binary: dict[str, bool], binary_default: bool
) -> tuple[dict[str, Any], bytes]:
    """The JSON answer and the binary part that follows it (empty when every output is JSON)."""
    outputs, tail = [], []
    for index, output in enumerate(response.outputs):
        raw = response.raw_output_contents[index] if index < len(response.raw_output_contents) else b""
        entry: dict[str, Any] = {
            "name": output.name,
            "datatype": output.datatype,
            "shape": list(output.shape),
        }
        if binary.get(output.name, binary_default):
            entry["parameters"] = {"binary_data_size": len(raw)}
            tail.append(raw)
        else:
            entry["data"] = from_raw(raw, output.datatype)
        outputs.append(entry)
    answer = {"model_name": response.model_name, "model_version": response.model_version, "outputs": outputs}
    if response.id:
        answer["id"] = response.id
    return answer, b"".join(tail)


def from_raw(raw: bytes, datatype: str) -> list[Any]:
    if datatype == "BYTES":
        values, at = [], 0
        while at + 4 <= len(raw):
            (size,) = _LENGTH.unpack_from(raw, at)
            values.append(raw[at + 4 : at + 4 + size].decode(errors="replace"))
            at += 4 + size
        return values
    return np.frombuffer(raw, dtype=np.dtype(_NUMPY[datatype]).newbyteorder("<")).tolist()  # type: ignore[no-any-return]
