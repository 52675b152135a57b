"""A bounded fuzz run of the v2 gRPC service (issue 21, acceptance 4), as test_fuzz_grpc.py does for
Sluice's own: ModelInferRequests built by hypothesis (valid, nearly valid and nonsense values), the same
truncated or with a byte changed, and random bytes, to ModelInfer, ModelStreamInfer and the unary v2
methods of the real server. No call may end INTERNAL or UNKNOWN (a stream's error_message neither), and
afterwards the server still serves and holds nothing."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sluice.kserve.v2 import grpc_service_pb2 as v2

from tests.support.processes import ServerProcess, wait_until

SERVICE = "/inference.GRPCInferenceService"
FORBIDDEN = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
SEEN: Counter[str] = Counter()
DATATYPES = ["FP32", "FP16", "FP64", "INT32", "INT64", "BOOL", "BYTES", "UINT8", "BF16", "", "fp32", "X"]
int64s = st.one_of(st.integers(-3, 600), st.sampled_from([512, 2**31, 2**62, 2**63 - 1, -(2**63)]))
PARAMETERS = [
    "priority",
    "max_tokens",
    "temperature",
    "top_k",
    "seed",
    "shared_memory_region",
    "stop",
    "junk",
]
UNARY = [
    "ModelMetadata", "ModelConfig", "ModelReady", "ServerLive", "SystemSharedMemoryRegister",
    "SystemSharedMemoryStatus", "RepositoryIndex",
]  # fmt: skip
texts = st.one_of(st.sampled_from(["", "x", "mlp", "byte-lm", "nope", "text_input"]), st.text(max_size=40))


def parameters(draw: st.DrawFn, target: object) -> None:
    for key in draw(st.lists(st.sampled_from(PARAMETERS), max_size=3)):
        kind = draw(
            st.sampled_from(["bool_param", "int64_param", "string_param", "double_param", "uint64_param"])
        )
        value = {
            "bool_param": st.booleans(), "int64_param": st.integers(-(2**63), 2**63 - 1),
            "string_param": st.text(max_size=10), "double_param": st.floats(allow_nan=True),
            "uint64_param": st.integers(0, 2**64 - 1),
        }[kind]  # fmt: skip
        setattr(target[key], kind, draw(value))  # type: ignore[index]


@st.composite
def requests(draw: st.DrawFn) -> v2.ModelInferRequest:
    request = v2.ModelInferRequest(model_name=draw(st.one_of(st.sampled_from(["mlp", "byte-lm"]), texts)))
    request.id = draw(st.text(max_size=20))
    parameters(draw, request.parameters)
    for _ in range(draw(st.integers(0, 3))):
        tensor = request.inputs.add(
            name=draw(st.one_of(st.sampled_from(["x", "text_input"]), texts)),
            datatype=draw(st.sampled_from(DATATYPES)),
            shape=draw(st.one_of(st.just([1, 512]), st.just([1]), st.lists(int64s, max_size=5))),
        )
        parameters(draw, tensor.parameters)
        payload = draw(st.sampled_from(["raw-right", "raw-any", "contents", "none"]))
        if payload == "raw-right":
            request.raw_input_contents.append(np.random.default_rng(0).bytes(512 * 4))
        elif payload == "raw-any":
            request.raw_input_contents.append(draw(st.binary(max_size=3000)))
        elif payload == "contents":
            tensor.contents.fp32_contents.extend(draw(st.lists(st.floats(width=32), max_size=520)))
            tensor.contents.bytes_contents.extend(draw(st.lists(st.binary(max_size=8), max_size=3)))
            tensor.contents.int_contents.extend(draw(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=3)))
    for name in draw(st.lists(texts, max_size=2)):
        request.outputs.add(name=name)
    return request


@st.composite
def plausible(draw: st.DrawFn) -> v2.ModelInferRequest:
    if draw(st.booleans()):
        request = v2.ModelInferRequest(model_name="mlp")
        rows = draw(st.integers(1, 3))
        request.inputs.add(name="x", datatype="FP32", shape=[rows, 512])
        request.raw_input_contents.append(np.random.default_rng(draw(st.integers(0, 9))).bytes(rows * 2048))
    else:
        request = v2.ModelInferRequest(model_name="byte-lm")
        prompt = draw(st.text(min_size=1, max_size=40)).encode()
        request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
        request.raw_input_contents.append(len(prompt).to_bytes(4, "little") + prompt)
        request.parameters["max_tokens"].int64_param = draw(st.integers(1, 6))
    request.parameters["priority"].uint64_param = draw(st.integers(0, 5))
    return request


@st.composite
def mangled(draw: st.DrawFn) -> bytes:
    data = draw(st.one_of(requests(), plausible())).SerializeToString()
    if not data:
        return data
    index = draw(st.integers(0, len(data) - 1))
    if draw(st.booleans()):
        return data[:index]
    return data[:index] + bytes([draw(st.integers(0, 255))]) + data[index + 1 :]


def serialized(strategy: st.SearchStrategy[v2.ModelInferRequest]) -> st.SearchStrategy[bytes]:
    return strategy.map(lambda m: m.SerializeToString())


bodies = st.one_of(serialized(plausible()), serialized(requests()), mangled(), st.binary(max_size=200))
calls = st.one_of(
    st.tuples(st.sampled_from(["ModelInfer", "ModelStreamInfer"]), bodies),
    st.tuples(st.sampled_from(UNARY), st.binary(max_size=200)),
)


@pytest.fixture(scope="module")
def fuzz_channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.target) as channel:
        yield channel


def call(channel: grpc.Channel, method: str, raw: bytes) -> str:
    path = f"{SERVICE}/{method}"
    try:
        if method == "ModelStreamInfer":
            for message in channel.stream_stream(path)(iter([raw]), timeout=20):
                text = v2.ModelStreamInferResponse.FromString(message).error_message
                if text:
                    return text.split(" ", 1)[0]
        else:
            channel.unary_unary(path)(raw, timeout=20)
    except grpc.RpcError as error:
        return str(error.code().name)
    return "OK"


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=calls)
def test_fuzzed_v2_calls_never_end_internal_or_unknown(
    fuzz_channel: grpc.Channel, case: tuple[str, bytes]
) -> None:
    method, raw = case
    outcome = call(fuzz_channel, method, raw)
    SEEN[outcome] += 1
    assert outcome not in {code.name for code in FORBIDDEN}, (method, raw[:200])


def test_after_the_v2_fuzz_run_the_server_serves_and_holds_nothing(server: ServerProcess) -> None:
    print(f"\nfuzzed v2 outcomes: {dict(SEEN)}")
    assert sum(SEEN.values()) >= 200 and SEEN["OK"] >= 10 and len(SEEN) >= 4, SEEN
    wait_until(lambda: server.metric("sluice_requests_in_flight") == 0, what="nothing in flight")
    wait_until(lambda: server.metric("sluice_sequences_active") == 0, what="no sequence left")
