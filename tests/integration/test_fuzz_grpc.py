"""A bounded fuzz run of the gRPC API (issue 7, acceptance 2; Tokenize and Detokenize, issue 31): messages
built by hypothesis from the .proto (valid, nearly valid and nonsense field values), random bytes, and valid
messages truncated or with bytes flipped, sent to the real server. No call may end INTERNAL or UNKNOWN, and
afterwards the server still serves and holds nothing."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from tests.support.processes import ServerProcess, wait_until

SERVICE = "/sluice.inference.v1.InferenceService"
FORBIDDEN = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
SEEN: Counter[str] = Counter()

int64s = st.one_of(st.integers(-3, 600), st.sampled_from([512, 2**31, 2**62, 2**63 - 1, -(2**63)]))
texts = st.one_of(
    st.sampled_from(["", "x", "mlp", "byte-lm", "nope"]),
    st.text(max_size=40),
    st.text(min_size=5000, max_size=9000, alphabet="ab"),
)
floats = st.floats(allow_nan=True, allow_infinity=True, width=32)


@st.composite
def tensors(draw: st.DrawFn) -> pb.Tensor:
    shape = draw(st.one_of(st.just([512]), st.lists(int64s, max_size=5), st.lists(st.just(1), max_size=70)))
    tensor = pb.Tensor(
        name=draw(st.one_of(st.just("x"), texts)),
        dtype=draw(st.integers(0, 9)),  # 8 and 9 are no DataType: proto3 keeps unknown enum values
        shape=shape,
    )
    payload = draw(st.sampled_from(["raw-right", "raw-any", "typed", "none"]))
    if payload == "raw-right":
        tensor.raw_contents = np.random.default_rng(draw(st.integers(0, 9))).bytes(512 * 4)
    elif payload == "raw-any":
        tensor.raw_contents = draw(st.binary(max_size=3000))
    elif payload == "typed":
        contents = tensor.contents
        contents.fp32_contents.extend(draw(st.lists(floats, max_size=520)))
        contents.int64_contents.extend(draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=8)))
        contents.bool_contents.extend(draw(st.lists(st.booleans(), max_size=8)))
        contents.string_contents.extend(draw(st.lists(st.text(max_size=8), max_size=8)))
    return tensor


@st.composite
def infer_requests(draw: st.DrawFn) -> pb.InferRequest:
    request = pb.InferRequest(
        model=draw(st.one_of(st.just("mlp"), texts)),
        inputs=draw(st.lists(tensors(), max_size=3)),
        priority=draw(st.integers(-2, 6)),
        request_id=draw(texts),
        typed_outputs=draw(st.booleans()),
    )
    for key in draw(st.lists(st.text(max_size=6), max_size=3)):
        request.parameters[key].double_value = draw(st.floats(allow_nan=True))
    return request


@st.composite
def generate_requests(draw: st.DrawFn) -> pb.GenerateRequest:
    sampling = pb.SamplingParams(stop=draw(st.lists(st.text(max_size=130), max_size=6)))
    if draw(st.booleans()):
        sampling.max_tokens = draw(st.integers(-5, 3000))
    else:
        sampling.max_tokens = draw(st.integers(1, 8))
    if draw(st.booleans()):
        sampling.temperature = draw(floats)
    if draw(st.booleans()):
        sampling.top_p = draw(floats)
    if draw(st.booleans()):
        sampling.top_k = draw(st.integers(-(2**31), 2**31 - 1))
    if draw(st.booleans()):
        sampling.seed = draw(st.integers(0, 2**64 - 1))
    request = pb.GenerateRequest(
        model=draw(st.one_of(st.just("byte-lm"), texts)),
        sampling=sampling,
        priority=draw(st.integers(-2, 6)),
        request_id=draw(st.text(max_size=20)),
    )
    if draw(st.booleans()):
        request.text = draw(st.one_of(st.text(max_size=60), st.text(min_size=1100, max_size=1200)))
    elif draw(st.booleans()):
        request.token_ids.ids.extend(draw(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=12)))
    elif draw(st.booleans()):
        request.chat.messages.add(role=draw(texts), content=draw(texts), tool_call_id=draw(texts))
    if draw(st.booleans()):
        _logits_settings(draw, sampling)
    if draw(st.booleans()):
        request.constraint.CopyFrom(draw(constraints()))
    if draw(st.booleans()):
        request.tools.add(
            name=draw(texts), parameters_json=draw(st.one_of(texts, json_texts)), strict=draw(st.booleans())
        )
        request.tool_choice.mode = draw(st.integers(-1, 5))
        if draw(st.booleans()):
            request.tool_choice.function = draw(texts)
    return request


# JSON-ish text: schemas that are valid, malformed, huge, deeply nested or pathological.
json_texts = st.one_of(
    st.sampled_from([
        "{}", '{"type": "object"}', '{"type": "string", "pattern": "(a+)+$"}', "[" * 5000, "{" * 20000,
        '{"$ref": "#"}', '{"type": "integer", "minimum": 5, "maximum": 1}', "null", "not json",
    ]),
    st.recursive(st.just("{}"), lambda inner: inner.map(lambda x: f'{{"anyOf": [{x}, {x}]}}'), max_leaves=64),
    st.text(max_size=200),
)  # fmt: skip


@st.composite
def constraints(draw: st.DrawFn) -> pb.Constraint:
    kind = draw(st.sampled_from(["json_schema", "json_object", "regex", "choice", "grammar", "none"]))
    message = pb.Constraint()
    if kind == "json_schema":
        message.json_schema = draw(json_texts)
    elif kind == "json_object":
        message.json_object.SetInParent()
    elif kind == "regex":
        message.regex = draw(
            st.one_of(texts, st.sampled_from(["(a+)+b", "a{1000000}", "[", "(?=x)", "\\p{L}+"]))
        )
    elif kind == "choice":
        message.choice.options.extend(draw(st.lists(texts, max_size=5)))
    elif kind == "grammar":
        grammar = st.sampled_from(
            ['start: "a" start', "start: start", "root ::= [a-", "start: /(a|aa)*/", ""]
        )
        message.grammar.text = draw(st.one_of(texts, grammar))
        message.grammar.syntax = draw(st.integers(-1, 4))
    return message


def _logits_settings(draw: st.DrawFn, sampling: pb.SamplingParams) -> None:
    sampling.presence_penalty = draw(floats)
    sampling.frequency_penalty = draw(floats)
    sampling.repetition_penalty = draw(floats)
    for token in draw(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=4)):
        sampling.logit_bias[token] = draw(floats)
    sampling.stop_token_ids.extend(draw(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=4)))


@st.composite
def plausible_infer(draw: st.DrawFn) -> pb.InferRequest:
    """What a real caller sends, with random values where any value is allowed."""
    x = np.random.default_rng(draw(st.integers(0, 2**32))).standard_normal(512).astype(np.float32)
    for index, value in draw(st.lists(st.tuples(st.integers(0, 511), floats), max_size=4)):
        x[index] = value  # NaN, infinities and huge values among ordinary ones
    tensor = pb.Tensor(name="x", dtype=pb.DATA_TYPE_FLOAT32, shape=[512], raw_contents=x.tobytes())
    return pb.InferRequest(
        model="mlp", inputs=[tensor], priority=draw(st.integers(0, 3)), request_id=draw(st.text(max_size=20))
    )


@st.composite
def plausible_generate(draw: st.DrawFn) -> pb.GenerateRequest:
    sampling = pb.SamplingParams(
        max_tokens=draw(st.integers(1, 8)),
        temperature=draw(st.floats(0, 2, width=32)),
        top_p=draw(st.floats(0.25, 1, width=32)),
        top_k=draw(st.integers(0, 50)),
        seed=draw(st.integers(0, 2**64 - 1)),
        stop=draw(st.lists(st.text(min_size=1, max_size=8), max_size=4)),
    )
    request = pb.GenerateRequest(model="byte-lm", sampling=sampling, priority=draw(st.integers(0, 3)))
    if draw(st.booleans()):
        request.text = draw(st.text(min_size=1, max_size=60))
    else:
        request.token_ids.ids.extend(draw(st.lists(st.integers(0, 255), min_size=1, max_size=12)))
    return request


@st.composite
def tokenize_requests(draw: st.DrawFn) -> pb.TokenizeRequest:
    """A text or a conversation (roles, calls and tools of any value), either option, any priority."""
    request = pb.TokenizeRequest(
        model=draw(st.one_of(st.just("byte-lm"), texts)),
        add_special_tokens=draw(st.booleans()),
        priority=draw(st.integers(-2, 6)),
        request_id=draw(st.text(max_size=20)),
    )
    if draw(st.booleans()):
        request.add_generation_prompt = draw(st.booleans())
    if draw(st.booleans()):
        request.text = draw(st.one_of(st.text(max_size=60), st.text(min_size=1100, max_size=1200)))
    elif draw(st.booleans()):
        message = request.chat.messages.add(role=draw(texts), content=draw(texts), name=draw(texts))
        if draw(st.booleans()):
            message.tool_calls.add(id=draw(texts), name=draw(texts), arguments=draw(json_texts))
        if draw(st.booleans()):
            request.tools.add(name=draw(texts), parameters_json=draw(json_texts))
    return request


@st.composite
def detokenize_requests(draw: st.DrawFn) -> pb.DetokenizeRequest:
    return pb.DetokenizeRequest(
        model=draw(st.one_of(st.just("byte-lm"), texts)),
        token_ids=draw(st.lists(st.integers(-(2**31), 2**31 - 1) | st.integers(0, 300), max_size=12)),
        priority=draw(st.integers(-2, 6)),
    )


def mangled(message: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    """A valid message cut short, or with one byte changed."""

    @st.composite
    def build(draw: st.DrawFn) -> bytes:
        data = draw(message).SerializeToString()
        if not data:
            return data
        if draw(st.booleans()):
            return data[: draw(st.integers(0, len(data) - 1))]
        index = draw(st.integers(0, len(data) - 1))
        return data[:index] + bytes([draw(st.integers(0, 255))]) + data[index + 1 :]

    return build()


calls = st.one_of(
    st.tuples(st.just("Infer"), plausible_infer().map(lambda m: m.SerializeToString())),
    st.tuples(st.just("Generate"), plausible_generate().map(lambda m: m.SerializeToString())),
    st.tuples(st.just("Infer"), infer_requests().map(lambda m: m.SerializeToString())),
    st.tuples(st.just("Generate"), generate_requests().map(lambda m: m.SerializeToString())),
    st.tuples(st.just("Infer"), mangled(infer_requests())),
    st.tuples(st.just("Generate"), mangled(generate_requests())),
    st.tuples(st.just("Tokenize"), tokenize_requests().map(lambda m: m.SerializeToString())),
    st.tuples(st.just("Detokenize"), detokenize_requests().map(lambda m: m.SerializeToString())),
    st.tuples(st.just("Tokenize"), mangled(tokenize_requests())),
    st.tuples(
        st.sampled_from(["Infer", "Generate", "GetModel", "ListModels", "Tokenize", "Detokenize"]),
        st.binary(max_size=200),
    ),
)


@pytest.fixture(scope="module")
def fuzz_channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.target) as channel:
        yield channel


def call(channel: grpc.Channel, method: str, raw: bytes) -> grpc.StatusCode:
    path = f"{SERVICE}/{method}"
    try:
        if method == "Generate":
            for message in channel.unary_stream(path)(raw, timeout=20):
                reply = pb.GenerateResponse.FromString(message)
                if reply.HasField("error"):
                    assert reply.error.code not in (c.value[0] for c in FORBIDDEN), reply
        else:
            channel.unary_unary(path)(raw, timeout=20)
    except grpc.RpcError as error:
        return error.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


@settings(
    max_examples=400,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=calls)
# Kinds of answer the run must reach whatever the draws: a model served by the other RPC, and a
# constrained stream that runs.
@example(case=("Generate", pb.GenerateRequest(model="mlp", text="x").SerializeToString()))
@example(case=("Infer", pb.InferRequest(model="byte-lm").SerializeToString()))
@example(
    case=(
        "Generate",
        pb.GenerateRequest(
            model="byte-lm",
            text="x",
            constraint=pb.Constraint(regex="[ab]{3}"),
            sampling=pb.SamplingParams(seed=1),
        ).SerializeToString(),
    )
)
def test_fuzzed_grpc_calls_never_end_internal_or_unknown(
    fuzz_channel: grpc.Channel, case: tuple[str, bytes]
) -> None:
    method, raw = case
    code = call(fuzz_channel, method, raw)
    SEEN[code.name] += 1
    assert code not in FORBIDDEN, (method, raw[:200])


def test_after_the_fuzz_run_the_server_serves_and_holds_nothing(server: ServerProcess) -> None:
    print(f"\nfuzzed gRPC outcomes: {dict(SEEN)}")
    # The run reached answers as well as several kinds of refusal.
    assert sum(SEEN.values()) >= 400 and SEEN["OK"] >= 40 and len(SEEN) >= 4, SEEN
    wait_until(lambda: server.metric("sluice_requests_in_flight") == 0, what="nothing in flight")
    wait_until(lambda: server.metric("sluice_requests_waiting") == 0, what="nothing waiting")
    wait_until(lambda: server.metric("sluice_kv_slots_in_use") == 0, what="no KV slot held")
    x = np.ones(512, np.float32)
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        tensor = pb.Tensor(name="x", dtype=pb.DATA_TYPE_FLOAT32, shape=[512], raw_contents=x.tobytes())
        reply = stub.Infer(pb.InferRequest(model="mlp", inputs=[tensor]), timeout=30)
        assert not any(math.isnan(v) for v in np.frombuffer(reply.outputs[0].raw_contents, np.float32))
