"""schemathesis against the shim's /openapi.json (issue 9, acceptance 3; issue 34, item 3; issue 31, item 1
and acceptance 2), bounded: generated requests to every route of every family (OpenAI, OpenAI Responses,
native, KServe v2, Anthropic, tokenize, the probes), with `model` drawn from the served models so that calls
reach the server; no answer is a 5xx, and every answer's status, content type and body are the ones the
document gives that route (generated clients and API gateways read them)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.processes import ServerProcess, ShimProcess

SCHEMATHESIS = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
pytestmark = pytest.mark.skipif(SCHEMATHESIS is None, reason="schemathesis is not installed")


def with_served_models(document: dict[str, Any], models: list[str]) -> dict[str, Any]:
    """Offers the served model names as the `model` values of every request schema (random names only
    ever reach 404)."""
    for schema in document["components"]["schemas"].values():
        model = schema.get("properties", {}).get("model")
        if model is not None and model.get("type") == "string":
            model["enum"] = models
    return document


def test_generated_requests_get_no_5xx_and_every_answer_is_documented(
    server: ServerProcess, shim: ShimProcess, tmp_path: Path
) -> None:
    document = httpx.get(f"{shim.url}/openapi.json", timeout=30).json()
    assert {
        "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models", "/v1/generate",
        "/v1/responses", "/v1/responses/{response_id}",
        "/v2/models/{name}/infer", "/metrics", "/readyz",
        "/v1/messages", "/v1/messages/count_tokens", "/tokenize", "/detokenize",
    } <= set(document["paths"])  # fmt: skip
    models = [m["id"] for m in httpx.get(f"{shim.url}/v1/models", timeout=30).json()["data"]]
    schema = tmp_path / "openapi.json"
    schema.write_text(json.dumps(with_served_models(document, models)))
    assert SCHEMATHESIS is not None
    result = subprocess.run(
        [
            SCHEMATHESIS, "run", str(schema), "--url", shim.url,
            "--checks",
            "not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance",
            "--max-examples", "25", "--generation-deterministic", "--request-timeout", "30",
            "--workers", "1", "--phases", "coverage,fuzzing",
        ],
        capture_output=True, text=True, timeout=600, check=False,
        cwd=tmp_path,  # its cache stays out of the tree
    )  # fmt: skip
    summary = result.stdout[-3000:]
    assert result.returncode == 0, summary
    generated = [line for line in summary.splitlines() if "generated" in line and "passed" in line]
    assert generated, summary
    print(f"\nschemathesis: {generated[0].strip()}")
    assert int(generated[0].split()[0]) >= 300, generated  # a few hundred cases, bounded by --max-examples
