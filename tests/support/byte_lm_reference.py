"""What the served byte LM must answer, computed in the test's own process from the raw model: the same
seeded weights (ByteLm at the server's size and context length) run by a plain eager pre-LN transformer
written here, each step a fresh causal forward over the whole sequence (no KV arena, no scripted graph, no
batching, no scheduler); greedy is the argmax, sampling the inverse CDF of softmax(logits / temperature)
at the seeded uniform of (seed, token index) that server/batching/sampling.py defines (its hash is the
contract a seeded request relies on). Tests compare served tokens with these: not any output passes."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from server.batching.sampling import uniforms
from server.runtimes.byte_lm import DEFAULT_CONTEXT, EOS, ByteLm
from tests.support.threads import one_thread

__all__ = ["EOS", "chat_prompt", "generate", "logits", "logprobs", "model", "text"]


@functools.cache
def model(context_length: int = DEFAULT_CONTEXT) -> ByteLm:
    lm = ByteLm(size="tiny", context_length=context_length, max_sequences=1, device=torch.device("cpu"))
    return lm


def logits(lm: ByteLm, ids: Sequence[int]) -> torch.Tensor:
    """The last position's logits [V] of the whole sequence, from the module's weights alone."""
    count = len(ids)
    x = lm.tok_emb(torch.tensor(ids)) + lm.pos_emb(torch.arange(count))
    for block in lm.blocks:
        qkv = block.qkv(block.ln1(x)).view(count, 3, lm.heads, lm.head_dim).permute(1, 2, 0, 3)
        attended = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
        x = x + block.proj(attended.permute(1, 0, 2).reshape(count, -1))
        x = x + block.mlp(block.ln2(x))
    last: torch.Tensor = lm.head(lm.ln_f(x[-1]))
    return last


def logprobs(prompt: str, tokens: Sequence[int]) -> list[float]:
    """Each token's log-probability under the model given the prompt and the tokens before it."""
    ids = list(prompt.encode())
    with one_thread(), torch.inference_mode():
        return [
            float(torch.log_softmax(logits(model(), ids + list(tokens[:i])).double(), dim=-1)[token])
            for i, token in enumerate(tokens)
        ]


def chat_prompt(messages: Sequence[dict[str, str]]) -> str:
    """The default chat template (a model without its own): `<|role|>` and the content on lines of their own,
    then `<|assistant|>` and a newline."""
    return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"


def generate(
    prompt: str | Sequence[int],
    max_tokens: int,
    *,
    temperature: float = 1.0,
    seed: int | None = None,
    ignore_eos: bool = False,
    min_tokens: int = 0,
    context_length: int = DEFAULT_CONTEXT,
) -> list[int]:
    """The token ids a request with these settings gets, the end-of-sequence token included where it ends
    the stream (as the server reports it); `seed` is required unless `temperature` is 0."""
    ids = list(prompt.encode()) if isinstance(prompt, str) else list(prompt)
    if temperature > 0 and seed is None:
        raise ValueError("a sampled reference needs the request's seed")
    lm = model(context_length)
    out: list[int] = []
    with one_thread(), torch.inference_mode():
        while len(out) < max_tokens:
            last = logits(lm, ids + out).float()
            if len(out) < min_tokens:
                last[EOS] = float("-inf")  # as the scheduler masks it until min_tokens
            if temperature <= 0:
                token = int(last.argmax())
            else:
                cdf = torch.softmax(last / temperature, dim=-1).cumsum(dim=-1)
                u = uniforms(np.array([seed], np.uint64), np.array([len(out)], np.int64))
                target = (torch.from_numpy(u) * cdf[-1]).to(cdf.dtype)
                token = min(int(torch.searchsorted(cdf, target, right=True)[0]), len(cdf) - 1)
            out.append(token)
            if token == EOS and not ignore_eos:  # ignore_eos: EOS is a token like any other
                break
    return out


def text(tokens: Sequence[int]) -> str:
    """The text the server streams for these tokens: their bytes as UTF-8 (special tokens have none)."""
    return bytes(t for t in tokens if t < 256).decode("utf-8", errors="replace")
