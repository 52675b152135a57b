"""The embedded generative model: a byte-level decoder-only transformer with a slot-indexed KV cache.

Weights are random but seeded, with an output bias towards printable ASCII so streamed text is legible.
Tokens 0-255 are bytes; 256 is end-of-sequence, 257 beginning-of-sequence. Its one option is its size
(`--model-options byte-lm.size=small`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from process.flags import setting
from server.domain import ModelDescriptor, ModelKind, ModelLimits
from server.runtimes.base import GenerativeModel
from server.runtimes.options import ModelContext

EOS, BOS, VOCAB = 256, 257, 258


@dataclass(frozen=True, slots=True)
class LmShape:
    d_model: int
    layers: int
    heads: int
    ffn: int


LmSize = Literal["tiny", "small", "bench"]

# "bench" is sized so one batch-32 decode step takes 10-30 ms on a 2-core CPU (the issue 4 benchmark).
SIZES: dict[LmSize, LmShape] = {
    "tiny": LmShape(d_model=64, layers=2, heads=4, ffn=256),
    "small": LmShape(d_model=256, layers=4, heads=4, ffn=1024),
    "bench": LmShape(d_model=512, layers=6, heads=8, ffn=2048),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ByteLmOptions:
    """`--model-options byte-lm.KEY=VALUE`."""

    size: LmSize = setting("tiny", help="size of the embedded byte LM")  # noqa: RUF009 (a dataclass field)


class _Block(nn.Module):
    def __init__(self, shape: LmShape) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(shape.d_model)
        self.qkv = nn.Linear(shape.d_model, 3 * shape.d_model)
        self.proj = nn.Linear(shape.d_model, shape.d_model)
        self.ln2 = nn.LayerNorm(shape.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(shape.d_model, shape.ffn), nn.GELU(), nn.Linear(shape.ffn, shape.d_model)
        )


class ByteLm(GenerativeModel, nn.Module):
    """Pre-LN transformer; keys/values of slot s, layer l live in k_cache[l, s] / v_cache[l, s]."""

    def __init__(
        self, *, size: LmSize, context_length: int, max_sequences: int, device: torch.device, seed: int = 0
    ) -> None:
        nn.Module.__init__(self)
        shape = SIZES[size]
        self.shape = shape
        self.heads, self.head_dim = shape.heads, shape.d_model // shape.heads
        self.vocab_size, self.eos_id, self.device = VOCAB, EOS, device
        torch.manual_seed(seed)
        self.tok_emb = nn.Embedding(VOCAB, shape.d_model)
        self.pos_emb = nn.Embedding(context_length, shape.d_model)
        self._layers = [_Block(shape) for _ in range(shape.layers)]
        self.blocks = nn.ModuleList(self._layers)  # registers them; _layers is the typed view
        self.ln_f = nn.LayerNorm(shape.d_model)
        self.head = nn.Linear(shape.d_model, VOCAB)
        with torch.no_grad():
            self.head.bias.fill_(-3.0)
            self.head.bias[32:127] = 0.0
            self.head.bias[10] = 0.0
            self.head.bias[EOS] = -12.0
        self.to(device).eval()
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)
        self.descriptor = ModelDescriptor(
            name="byte-lm",
            version=f"1-{size}",
            kind=ModelKind.GENERATIVE,
            description=f"Byte-level transformer ({size}: d={shape.d_model}, layers={shape.layers}), seeded",
            limits=ModelLimits(
                max_batch_size=max_sequences,
                context_length=context_length,
                max_tokens=context_length - 1,
                max_concurrent_sequences=max_sequences,
            ),
            device=str(device),
        )

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def token_bytes(self, token_id: int) -> bytes:
        return bytes((token_id,)) if token_id < 256 else b""

    def slot_bytes(self, context_length: int) -> int:
        return 2 * self.shape.layers * self.heads * context_length * self.head_dim * 4

    def allocate_cache(self, slots: int, context_length: int) -> int:
        dims = (self.shape.layers, slots, self.heads, context_length, self.head_dim)
        self.k_cache = torch.zeros(dims, device=self.device)
        self.v_cache = torch.zeros(dims, device=self.device)
        return 2 * self.k_cache.numel() * self.k_cache.element_size()

    def prefill(self, slot: int, token_ids: Sequence[int]) -> torch.Tensor:
        n = len(token_ids)
        ids = torch.tensor(token_ids, device=self.device)
        x = self.tok_emb(ids) + self.pos_emb(torch.arange(n, device=self.device))
        for layer, block in enumerate(self._layers):
            qkv = block.qkv(block.ln1(x)).view(n, 3, self.heads, self.head_dim).permute(1, 2, 0, 3)
            q, k, v = qkv[0], qkv[1], qkv[2]  # [H, n, Dh]
            self.k_cache[layer, slot, :, :n] = k
            self.v_cache[layer, slot, :, :n] = v
            attn = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]
            x = x + block.proj(attn.transpose(0, 1).reshape(n, -1))
            x = x + block.mlp(block.ln2(x))
        out: torch.Tensor = self.head(self.ln_f(x[-1]))
        return out

    def prefill_many(self, prompts: Sequence[tuple[int, Sequence[int]]]) -> torch.Tensor:
        """Right-pads the prompts into one batch: one forward pass instead of one per joining sequence."""
        if len(prompts) == 1:
            return self.prefill(*prompts[0])[None]
        lengths = [len(ids) for _, ids in prompts]
        span = max(lengths)
        ids = torch.zeros(len(prompts), span, dtype=torch.long, device=self.device)
        for row, (_, tokens) in enumerate(prompts):
            ids[row, : len(tokens)] = torch.tensor(tokens, device=self.device)
        valid = (
            torch.arange(span, device=self.device)[None, :]
            < torch.tensor(lengths, device=self.device)[:, None]
        )
        causal = torch.ones(span, span, dtype=torch.bool, device=self.device).tril()
        # Padded keys are never attended; padded queries still see their own valid prefix (no empty rows).
        mask = (causal[None] & valid[:, None, :])[:, None]
        n = len(prompts)
        x = self.tok_emb(ids) + self.pos_emb(torch.arange(span, device=self.device))[None]
        for layer, block in enumerate(self._layers):
            qkv = block.qkv(block.ln1(x)).view(n, span, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]  # [N, H, span, Dh]
            for row, (slot, _) in enumerate(prompts):
                self.k_cache[layer, slot, :, : lengths[row]] = k[row, :, : lengths[row]]
                self.v_cache[layer, slot, :, : lengths[row]] = v[row, :, : lengths[row]]
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            x = x + block.proj(attn.transpose(1, 2).reshape(n, span, -1))
            x = x + block.mlp(block.ln2(x))
        last = x[torch.arange(n, device=self.device), torch.tensor(lengths, device=self.device) - 1]
        out: torch.Tensor = self.head(self.ln_f(last))
        return out

    def decode(self, slots: Sequence[int], tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        b = len(slots)
        span = int(positions.max()) + 1
        # Consecutive slots (the common case: the pool hands out the lowest free ones) are read as a view.
        first = slots[0]
        contiguous = list(slots) == list(range(first, first + b))
        rows = slice(first, first + b) if contiguous else torch.tensor(slots, device=self.device)
        slot_index = torch.as_tensor(slots, device=self.device)
        mask = (torch.arange(span, device=self.device)[None, :] <= positions[:, None])[:, None, None, :]
        x = self.tok_emb(tokens) + self.pos_emb(positions)
        for layer, block in enumerate(self._layers):
            qkv = block.qkv(block.ln1(x)).view(b, 3, self.heads, self.head_dim)
            q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]  # [B, H, Dh]
            self.k_cache[layer, slot_index, :, positions] = k
            self.v_cache[layer, slot_index, :, positions] = v
            keys = self.k_cache[layer, rows, :, :span]
            values = self.v_cache[layer, rows, :, :span]
            attn = F.scaled_dot_product_attention(q[:, :, None, :], keys, values, attn_mask=mask)
            x = x + block.proj(attn.reshape(b, -1))
            x = x + block.mlp(block.ln2(x))
        out: torch.Tensor = self.head(self.ln_f(x))
        return out


def byte_lm(options: ByteLmOptions, context: ModelContext) -> ByteLm:
    return ByteLm(
        size=options.size,
        context_length=context.context_length,
        max_sequences=context.max_sequences,
        device=context.device,
    )
