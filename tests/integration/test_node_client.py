"""The Node.js client (clients/node, @grpc/grpc-js) against the real server: models, Infer, Generate."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

from tests.integration.test_python_client import reference_mlp
from tests.support import byte_lm_reference
from tests.support.processes import ROOT, ServerProcess

NODE_DIR = ROOT / "clients" / "node"
pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or not (NODE_DIR / "node_modules").is_dir(),
    reason="node or clients/node/node_modules missing (make test-tools runs npm ci)",
)


def node(server: ServerProcess, *args: str, script: str | None = None) -> list[dict[str, object]]:
    """cli.js's output lines, or those of an inline `script` given the target."""
    command = (
        ["node", "-e", script, server.target] if script else ["node", "cli.js", "--target", server.target]
    )
    out = subprocess.run(
        [*command, *args],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def test_node_lists_models(server: ServerProcess) -> None:
    assert sorted(str(m["name"]) for m in node(server, "models")) == ["all-minilm-l6-v2", "byte-lm", "mlp"]


def test_node_infer_matches_the_model(server: ServerProcess) -> None:
    (line,) = node(server, "infer", "mlp", "--fill", "0.5", "--size", "512")
    outputs = line["outputs"]
    y = outputs["y"] if isinstance(outputs, dict) else next(o for o in outputs if o["name"] == "y")  # type: ignore[union-attr]
    got = np.asarray(y["data"], dtype=np.float32)  # type: ignore[index]
    np.testing.assert_allclose(got, reference_mlp(np.full(512, 0.5, dtype=np.float32)), rtol=1e-4, atol=1e-5)


def test_node_generate_streams_until_length(server: ServerProcess) -> None:
    lines = node(server, "generate", "byte-lm", "Hello", "--max-tokens", "12", "--seed", "5")
    assert len(lines) >= 2
    assert lines[-1]["finish_reason"] == "length"
    assert lines[-1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 12, "total_tokens": 17}
    sampled = [t for line in lines for t in line.get("token_ids") or []]
    assert sampled == byte_lm_reference.generate("Hello", 12, seed=5)


CONSTRAINED = r"""
const { createClient } = require('./index.js');
(async () => {
  const client = createClient(process.argv[1]);
  const out = {};
  const collect = async (prompt, opts) => {
    const chunks = [];
    for await (const chunk of client.generate('byte-lm', prompt, opts)) chunks.push(chunk);
    return { text: chunks.map((c) => c.text).join(''), last: chunks[chunks.length - 1] };
  };
  out.choice = await collect('x', { seed: 1, constraint: { choice: ['left', 'right'] } });
  out.schema = await collect('x', { seed: 2, maxTokens: 80,
    constraint: { jsonSchema: { type: 'object',
      properties: { n: { type: 'integer', minimum: 0, maximum: 9 } },
      required: ['n'], additionalProperties: false } } });
  out.biased = await collect('x', { temperature: 0, maxTokens: 3, logitBias: { 67: 100 } });
  out.tool = await collect([{ role: 'user', content: 'weather?' }], { seed: 3, maxTokens: 150,
    tools: [{ name: 'get_weather', parameters: { type: 'object',
      properties: { city: { type: 'string', maxLength: 6 } }, required: ['city'] } }],
    toolChoice: { function: 'get_weather' } });
  process.stdout.write(JSON.stringify(out));
  client.close();
})().catch((e) => { process.stderr.write(String(e.stack)); process.exit(1); });
"""


def test_node_generates_under_constraints_and_calls_tools(server: ServerProcess) -> None:
    """Issue 20: the Node client takes constraints, logits settings, chat prompts and tools."""
    out = subprocess.run(
        ["node", "-e", CONSTRAINED, server.target],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["choice"]["text"] in ("left", "right")
    assert 0 <= json.loads(result["schema"]["text"])["n"] <= 9
    assert result["biased"]["text"] == "CCC"
    tool = result["tool"]["last"]
    assert tool["finishReason"] == "tool_calls" and tool["toolCalls"][0]["name"] == "get_weather"
    assert isinstance(json.loads(tool["toolCalls"][0]["arguments"])["city"], str)
