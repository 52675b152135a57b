"""Chat templates (issue 9, point 2): a Hugging Face model whose tokenizer has a chat template is prompted
through that template, over gRPC and through the shim's OpenAI chat route."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from clients import ChatMessage, SluiceClient
from tests.support.hf_models import save_with_tokenizer
from tests.support.processes import ServerProcess, ShimProcess, start_server, start_shim

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def templated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A seeded tiny Llama with a byte-level BPE tokenizer trained here, and a chat template of its own."""
    return save_with_tokenizer(tmp_path_factory.mktemp("templated-llama"), template=TEMPLATE)


@pytest.fixture(scope="module")
def stack(templated: Path) -> Iterator[tuple[ServerProcess, ShimProcess, object]]:
    server = start_server("--hf-models", f"chat={templated}", "--default-max-tokens", "16")
    shim = start_shim(server.target)
    yield server, shim, transformers.AutoTokenizer.from_pretrained(templated)
    shim.terminate()
    assert server.terminate() == 0


def test_the_models_own_template_renders_the_prompt(stack: tuple[ServerProcess, ShimProcess, object]) -> None:
    server, shim, tokenizer = stack
    expected = tokenizer.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True)  # type: ignore[attr-defined]
    if not isinstance(expected, list):
        expected = expected["input_ids"]
    with SluiceClient(server.target) as client:
        chunks = list(
            client.generate("chat", [ChatMessage(m["role"], m["content"]) for m in MESSAGES], max_tokens=2)
        )  # type: ignore[arg-type]
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == len(expected)
    with openai.OpenAI(base_url=f"{shim.url}/v1", api_key="unused") as sdk:
        answer = sdk.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=2, temperature=0)  # type: ignore[arg-type]
    assert answer.usage is not None and answer.usage.prompt_tokens == len(expected)
