"""Chat templates (issue 9, point 2): a Hugging Face model whose tokenizer has a chat template is prompted
through that template, over gRPC and through the shim's OpenAI chat route."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import torch

from clients import ChatMessage, SluiceClient
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
    path = tmp_path_factory.mktemp("templated-llama")
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["</s>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(["hello there, you are terse", "[system] [user] [assistant]"] * 20, trainer)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="</s>")
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(path)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
        eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return path


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
