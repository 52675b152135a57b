"""A newcomer's first hour (issue 8, items 1, 2 and 5): the README's plugin example run as written from a
temporary directory, a Hugging Face model served with --hf-models alone, every configuration mistake one
line and exit 2 before anything listens, and reflection under both of its names."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from grpc_reflection.v1alpha import reflection_pb2

from clients import SluiceClient
from tests.support.hf_models import greedy_reference
from tests.support.processes import ROOT, ServerProcess, start_server
from tests.support.readme import readme_block

SLUICE = str(Path(sys.executable).parent / "sluice")


def run_sluice(*args: str, cwd: Path = ROOT, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SLUICE, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_the_readme_plugin_example_runs_as_written(tmp_path: Path) -> None:
    (tmp_path / "my_models.py").write_text(readme_block("# my_models.py"))
    command = next(line for line in readme_block("sluice serve --plugins").splitlines() if line.strip())
    args = [*command.split()[1:], "--port", "0", "--metrics-port", "0"]  # any free port, not 50051
    server = ServerProcess(
        args, entry=["-c", "import sys; from launcher.cli import main; sys.exit(main())"], cwd=tmp_path
    )
    try:
        server.wait_listening()
        server.wait_ready()
        with SluiceClient(server.target) as client:
            y = client.infer("doubler", {"x": np.arange(4, dtype=np.float32)}).outputs["y"]
            assert sorted(m.name for m in client.list_models()) == ["doubler", "mlp"]
        np.testing.assert_array_equal(y, [0, 2, 4, 6])
    finally:
        assert server.stop(30) == 0, server.diagnostics()


def test_hf_models_alone_serve_just_those(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        vocab_size=258, n_positions=64, n_embd=32, n_layer=1, n_head=2, eos_token_id=256
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "gen")
    server = start_server("--hf-models", f"gen={tmp_path / 'gen'}")
    try:
        with SluiceClient(server.target) as client:
            assert [m.name for m in client.list_models()] == ["gen"]
            chunks = list(client.generate("gen", "hi", max_tokens=4, temperature=0.0, ignore_eos=True))
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
        # The checkpoint's own greedy tokens (transformers' generate): the server ran that model.
        expected = greedy_reference(tmp_path / "gen", list(b"hi"), 4)
        assert [t for c in chunks for t in c.token_ids] == expected
    finally:
        assert server.terminate() == 0, server.diagnostics()


def busy_port() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    return sock


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["serve", "--models", "mlp,nope"], "invalid setting models: unknown nope"),
        (
            ["serve", "--plugins", "no_such_plugin"],
            "invalid setting plugins: importing 'no_such_plugin' failed",
        ),
        (["serve", "--hf-models", "gen=/nonexistent"], "invalid setting hf_models: gen=/nonexistent needs"),
        (["serve", "--max-qeue", "8"], "did you mean: --max-qeue -> --max-queue?"),
        (["serve", "--port", "eighty"], "argument --port: takes an integer"),
        (["up", "--max-qeue", "8"], "sluice up: unrecognized arguments: --max-qeue 8"),
        (["up", "--models", "nope"], "sluice up: invalid setting models: unknown nope"),
        (["serve", "--port", "BUSY"], "invalid setting port: cannot listen on 127.0.0.1:"),
    ],
)
def test_configuration_mistakes_are_one_line_and_exit_2_with_nothing_running(
    args: list[str], says: str
) -> None:
    occupied = busy_port()
    try:
        port = str(occupied.getsockname()[1])
        result = run_sluice(*[port if a == "BUSY" else a for a in args], "--metrics-port", "-1")
    finally:
        occupied.close()
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result
    assert len(lines) == 1 and says in lines[0], lines
    assert "Traceback" not in result.stderr + result.stdout
    assert "listening" not in result.stdout  # nothing was started, so nothing is left running


def test_help_version_and_forwarded_flags() -> None:
    up_help = run_sluice("up", "--help").stdout
    assert (
        "--grpc-port" in up_help
        and "--max-queue" in up_help
        and "(requests; default: 64)" in " ".join(up_help.split())
    )
    assert run_sluice("--version").stdout.startswith("sluice ")
    shim_help = " ".join(run_sluice("shim", "--help").stdout.split())
    assert "--header-timeout-s" in shim_help and "default:" in shim_help


def reflection_services(channel: grpc.Channel, service: str) -> list[str]:
    call = channel.stream_stream(
        f"/{service}/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    (reply,) = list(call(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=30))
    return [s.name for s in reply.list_services_response.service]


def test_reflection_answers_under_v1_and_v1alpha(server: ServerProcess, channel: grpc.Channel) -> None:
    for service in ("grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"):
        names = reflection_services(channel, service)
        assert (
            "sluice.inference.v1.InferenceService" in names and "grpc.reflection.v1.ServerReflection" in names
        )
    describe = channel.stream_stream(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    request = reflection_pb2.ServerReflectionRequest(
        file_containing_symbol="grpc.reflection.v1.ServerReflection"
    )
    (reply,) = list(describe(iter([request]), timeout=30))
    assert reply.file_descriptor_response.file_descriptor_proto, reply


def test_reflection_can_be_turned_off() -> None:
    server = start_server("--models", "mlp", "--reflection", "false")
    try:
        with grpc.insecure_channel(server.target) as channel, pytest.raises(grpc.RpcError) as info:
            reflection_services(channel, "grpc.reflection.v1.ServerReflection")
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        assert server.terminate() == 0


def test_the_metrics_port_binds_apart_from_the_grpc_host() -> None:
    server = start_server("--models", "mlp", "--host", "127.0.0.1", "--metrics-host", "127.0.0.2")
    try:
        assert httpx.get(f"http://127.0.0.2:{server.metrics_port}/metrics", timeout=10).status_code == 200
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10)
    finally:
        assert server.terminate() == 0, server.diagnostics()
