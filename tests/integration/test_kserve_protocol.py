"""Issue 21: Sluice's v2 messages (protos/sluice/kserve/v2) against the reference, tritonclient's own
generated descriptors (run in .venv-triton): the same service, methods, streaming, and for every field
Sluice defines the same name, number, type and repetition. ModelConfig is a subset: Sluice fills fewer fields,
never a field of another number or type."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from sluice.kserve.v2 import grpc_service_pb2 as v2

from tests.integration.test_kserve_tritonclient import TRITON_PY
from tests.support.processes import ROOT


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    if not TRITON_PY.exists():
        pytest.fail(f"{TRITON_PY} is missing: `make test` builds it (bash scripts/setup_triton.sh)")
    done = subprocess.run(
        [str(TRITON_PY), str(ROOT / "tests" / "support" / "triton_descriptors.py")],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def ours() -> dict[str, dict[str, list[Any]]]:
    out: dict[str, dict[str, list[Any]]] = {}

    def visit(message: Any) -> None:
        out[message.full_name] = {
            f.name: [f.number, f.type, f.is_repeated, f.message_type.full_name if f.message_type else ""]
            for f in message.fields
        }
        for nested in message.nested_types:
            visit(nested)

    for message in v2.DESCRIPTOR.message_types_by_name.values():
        visit(message)
    return out


def test_the_service_and_its_methods_are_the_protocols(reference: dict[str, Any]) -> None:
    service = v2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert service.full_name == "inference.GRPCInferenceService"
    methods = {
        m.name: [m.input_type.full_name, m.output_type.full_name, m.client_streaming, m.server_streaming]
        for m in service.methods
    }
    assert methods == reference["methods"]


def test_every_field_has_the_protocols_name_number_and_type(reference: dict[str, Any]) -> None:
    mine = ours()
    subsets = {"inference.ModelConfig", "inference.ModelInput", "inference.ModelOutput",
               "inference.ModelDynamicBatching"}  # fmt: skip
    for name, fields in mine.items():
        assert name in reference["messages"], name
        theirs = {k: v for k, v in reference["messages"][name].items() if k in fields}
        assert fields == theirs, name
        if name not in subsets:
            assert set(fields) == set(reference["messages"][name]), f"{name} lacks fields"
    assert {k: v for k, v in reference["data_types"].items()} == dict(v2.DataType.items())
