"""Issue 11, acceptance 4 (the fuzz part): fuzzed credentials and metadata against a server and a shim with
a keys file. Random `authorization` and `api-key` values (schemes, spacing, huge, near-miss tokens, the
right one), extra metadata and headers: no call ends INTERNAL or UNKNOWN, no HTTP answer is 5xx, and a
call is served exactly when it presents the right token."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator

import grpc
import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sluice.inference.v1 import inference_pb2 as pb

from tests.support.processes import ServerProcess, ShimProcess, start_server, start_shim

TOKEN = "fuzz-token-0123456789"
SEEN: Counter[str] = Counter()
printable = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=80)
credentials = st.one_of(
    st.just(f"Bearer {TOKEN}"),
    st.just(f"bearer   {TOKEN}  "),
    st.sampled_from(
        ["", "Bearer", "Bearer ", "Basic " + TOKEN, TOKEN, f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}"]
    ),
    printable.map(lambda t: f"Bearer {t}"),
    printable,
    st.text(alphabet="ab", min_size=3000, max_size=6000).map(lambda t: f"Bearer {t}"),
)
extra = st.dictionaries(
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12).filter(
        lambda k: not k.startswith("grpc-") and k not in ("authorization", "te", "content-type")
    ),
    printable,
    max_size=4,
)
X = np.ones(512, np.float32)
BODY = pb.InferRequest(
    model="mlp",
    inputs=[pb.Tensor(name="x", dtype=pb.DATA_TYPE_FLOAT32, shape=[512], raw_contents=X.tobytes())],
).SerializeToString()


def served_with(credential: str | None) -> bool:
    if credential is None:
        return False
    scheme, _, token = credential.partition(" ")
    return scheme.lower() == "bearer" and token.strip() == TOKEN


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, ShimProcess]]:
    keys = tmp_path_factory.mktemp("fuzz-keys") / "keys.toml"
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    keys.write_text(f'[[tenant]]\nname = "fuzz"\ntoken_sha256 = "{digest}"\n')
    server = start_server("--models", "mlp", "--auth-keys", str(keys))
    shim = start_shim(server.target, "--auth-keys", str(keys))
    yield server, shim
    shim.terminate()
    assert server.terminate() == 0


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip
@given(credential=st.one_of(st.none(), credentials), more=extra)
def test_fuzzed_credentials_on_grpc(
    guarded: tuple[ServerProcess, ShimProcess], credential: str | None, more: dict[str, str]
) -> None:
    server, _ = guarded
    metadata = [*more.items(), *([("authorization", credential)] if credential is not None else [])]
    with grpc.insecure_channel(server.target) as channel:
        try:
            channel.unary_unary("/sluice.inference.v1.InferenceService/Infer")(
                BODY, metadata=metadata, timeout=20
            )
            code = grpc.StatusCode.OK
        except grpc.RpcError as error:
            code = error.code()
    SEEN[f"grpc {code.name}"] += 1
    assert code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
    assert (code == grpc.StatusCode.OK) == served_with(credential), (credential, code)


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip
@given(credential=st.one_of(st.none(), credentials), api_key=st.one_of(st.none(), printable), more=extra)
def test_fuzzed_credentials_on_http(
    guarded: tuple[ServerProcess, ShimProcess],
    credential: str | None,
    api_key: str | None,
    more: dict[str, str],
) -> None:
    _, shim = guarded
    headers = {**more, "content-type": "application/json"}
    if credential is not None:
        headers["authorization"] = credential
    if api_key is not None:
        headers["api-key"] = api_key
    body = {
        "model": "mlp",
        "inputs": [{"name": "x", "dtype": "FLOAT32", "shape": [512], "data": [1.0] * 512}],
    }
    try:
        answer = httpx.post(f"{shim.url}/v1/infer", json=body, headers=headers, timeout=20)
    except httpx.LocalProtocolError:
        return  # httpx will not send that header at all
    SEEN[f"http {answer.status_code}"] += 1
    assert answer.status_code < 500, answer.text
    expected = served_with(credential) if credential is not None else (api_key or "").strip() == TOKEN
    assert (answer.status_code == 200) == expected, (credential, api_key, answer.status_code)


def test_the_fuzz_reached_both_verdicts() -> None:
    print(f"\nfuzzed credentials: {dict(SEEN)}")
    assert SEEN["grpc OK"] >= 5 and SEEN["grpc UNAUTHENTICATED"] >= 50
    assert SEEN["http 200"] >= 5 and SEEN["http 401"] >= 50
