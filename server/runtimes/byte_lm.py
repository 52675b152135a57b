"""The embedded generative model: a byte-level decoder-only transformer over the server's KV arena.

Weights are random but seeded, with an output bias towards printable ASCII so streamed text is legible.
Tokens 0-255 are bytes; 256 is end-of-sequence, 257 beginning-of-sequence. Its one option is its size
(`--model-options byte-lm.size=small`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from process.flags import setting
from server.domain import ModelDescriptor, ModelKind, ModelLimits
from server.kv.tensors import KvTensors
from server.runtimes.base import GenerativeModel, Prefill
from server.runtimes.byte_lm_graph import LAYER_WEIGHTS, compiled
from server.runtimes.options import ModelContext
from server.runtimes.step_attention import Heads, StepAttention
from server.runtimes.step_batch import StepBatch

EOS, BOS, VOCAB = 256, 257, 258
DEFAULT_CONTEXT = 1024  # its learned positions; --context-length sets another (and other weights)


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
    """Pre-LN transformer; keys/values of layer l, arena token t live in kv.k[l, :, t] / kv.v[l, :, t]."""

    chunked_prefill = True

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
        # Per layer, in byte_lm_graph.LAYER_WEIGHTS order: one list the scripted stack walks.
        self._weights = [
            [dict(block.named_parameters())[name].detach() for name in LAYER_WEIGHTS]
            for block in self._layers
        ]
        self.kv = KvTensors(shape.layers, self.heads, self.head_dim, dtype=torch.float32, device=device)
        self._geometry = Heads(self.heads, self.heads, self.head_dim, None)
        self._no_rows = torch.empty(0, dtype=torch.long, device=device)
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

    def forward(
        self,
        prefills: Sequence[Prefill],
        bases: Sequence[int],
        tokens: torch.Tensor,
        positions: torch.Tensor,
        *,
        computing: Callable[[], None] = lambda: None,
        prefixes: Sequence[tuple[int, int]] = (),
    ) -> torch.Tensor:
        """Every prefill chunk's tokens and every decoding row's one token in one flat batch, attention over
        zero-copy views of the arena (as the Llama decoder's, runtimes/step_attention.py)."""
        device = self.device
        ids = [t for p in prefills for t in p.token_ids]
        pos = [at for p in prefills for at in range(p.start, p.start + len(p.token_ids))]
        flat_ids = torch.cat([torch.tensor(ids, dtype=torch.long, device=device), tokens])
        flat_pos = torch.cat([torch.tensor(pos, dtype=torch.long, device=device), positions])
        starts = [p.base for p in prefills for _ in p.token_ids]
        flat_token = flat_pos + torch.cat(
            [
                torch.tensor(starts, dtype=torch.long, device=device),
                torch.as_tensor(bases, dtype=torch.long, device=device),
            ]
        )
        arena = self.kv.k.shape[2]
        plan = StepAttention.plan(
            self._geometry, device, arena, prefills, bases, positions.tolist(), prefixes
        )
        x = self.tok_emb(flat_ids) + self.pos_emb(flat_pos)
        computing()
        x = compiled()(
            x, flat_token, self.kv.k, self.kv.v, self._weights, self.heads, self.head_dim, *plan.graph_args()
        )
        logits: torch.Tensor = self.head(self.ln_f(x[plan.last_rows()]))
        return logits

    shares_prefixes = True

    def step(self, batch: StepBatch, *, computing: Callable[[], None] = lambda: None) -> torch.Tensor:
        if not any(held for _, held in batch.prefixes):  # as GenerativeModel.step: a subclass's forward
            return super().step(batch, computing=computing)
        return self.forward(
            batch.prefills, batch.bases, batch.tokens, batch.positions, computing=computing,
            prefixes=batch.prefixes,
        )  # fmt: skip

    def prefill(self, base: int, token_ids: Sequence[int], start: int = 0) -> torch.Tensor:
        return self.forward([Prefill(base, token_ids, start)], [], self._no_rows, self._no_rows)[0]

    def prefill_many(self, prompts: Sequence[Prefill]) -> torch.Tensor:
        return self.forward(prompts, [], self._no_rows, self._no_rows)

    def decode(self, bases: Sequence[int], tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.forward([], bases, tokens, positions)


def byte_lm(options: ByteLmOptions, context: ModelContext) -> ByteLm:
    return ByteLm(
        size=options.size,
        context_length=context.context_length or DEFAULT_CONTEXT,
        max_sequences=context.max_sequences,
        device=context.device,
    )
