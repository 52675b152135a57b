"""The runtime interfaces a model implements to be served: TensorModel (Infer) and GenerativeModel (Generate).

Both run inside the model's executor thread under torch.inference_mode(); they never see the wire.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

import numpy as np
import torch

from server.domain import Array, ChatTurn, DType, ModelDescriptor, TensorSpec
from server.errors import InvalidArgument, clip
from server.kv.tensors import KvTensors
from server.runtimes.lora import LoraAdapter
from server.runtimes.lora_limits import AdapterError, LoraLimits
from server.runtimes.step_batch import Prefill as Prefill  # where runtimes and plugins have imported it
from server.runtimes.step_batch import StepBatch
from server.tools.format import default_turns
from wire.constraint import Tool


class TensorModel(abc.ABC):
    """A batchable model: a batch of items in, one dict of named outputs per item out."""

    descriptor: ModelDescriptor

    @functools.cached_property
    def _input_specs(self) -> dict[str, TensorSpec]:
        """The descriptor's inputs by name, built once rather than per request."""
        return {spec.name: spec for spec in self.descriptor.inputs}

    def validate(self, inputs: Mapping[str, Array]) -> None:
        """Rejects an item whose names, dtypes or shapes do not match the descriptor (before queueing)."""
        specs = self._input_specs
        if len(inputs) == len(specs):  # the common call: each input as declared, in order
            for (name, array), (want, dtype, shape) in zip(inputs.items(), self._exact_inputs, strict=True):
                if name != want or array.dtype != dtype or array.shape != shape or not array.size:
                    break
            else:
                return
        positions = {}
        for index, name in enumerate(inputs):
            if name not in specs:
                raise InvalidArgument(
                    f"unknown input {clip(name)!r}; expected {sorted(specs)}", field=f"inputs[{index}].name"
                )
            positions[name] = index
        for spec in specs.values():
            if spec.name not in inputs:
                raise InvalidArgument(f"missing input {spec.name!r}", field="inputs")
            index = positions[spec.name]
            array = inputs[spec.name]
            if spec.dtype is not DType.STRING and array.dtype != spec.dtype.numpy:
                raise InvalidArgument(
                    f"input {spec.name!r} must be {spec.dtype.name}, got {array.dtype}",
                    field=f"inputs[{index}].dtype",
                )
            if array.size == 0:
                raise InvalidArgument(f"input {spec.name!r} is empty", field=f"inputs[{index}].shape")
            if len(array.shape) != len(spec.shape) or any(
                want not in (-1, got) for want, got in zip(spec.shape, array.shape, strict=True)
            ):
                raise InvalidArgument(
                    f"input {spec.name!r} must have shape {list(spec.shape)} (no batch dimension), "
                    f"got {list(array.shape)}",
                    field=f"inputs[{index}].shape",
                )

    @functools.cached_property
    def _exact_inputs(self) -> tuple[tuple[str | None, np.dtype[np.generic], tuple[int, ...]], ...]:
        """(name, numpy dtype, shape) per declared input, for validate's one-pass check of a call that
        matches exactly (a STRING input, named None here, or a -1 dimension never does: the checks below
        decide it)."""
        return tuple(
            (None if spec.dtype is DType.STRING else spec.name, spec.dtype.numpy, tuple(spec.shape))
            for spec in self.descriptor.inputs
        )

    def bucket(self, inputs: Mapping[str, Array]) -> Hashable:
        """Items with equal buckets may share a batch; variable-length models group by length here."""
        return 0

    @abc.abstractmethod
    def forward(self, batch: Sequence[Mapping[str, Array]]) -> list[dict[str, Array]]:
        """Runs one forward pass over a batch of validated items from one bucket."""

    def warmup(self, steps: int) -> None:
        """Runs `steps` forward passes on synthetic input so first requests do not pay for lazy init."""
        item = synthetic_item(self.descriptor)
        for _ in range(steps):
            self.forward([item] * self.descriptor.limits.max_batch_size)


#: For a model without a chat template of its own: each turn as `<|role|>` on a line of its own, then its
#: content and a newline; the prompt ends with `<|assistant|>` and a newline.
DEFAULT_CHAT_TEMPLATE = "<|{role}|>\n{content}\n"


GENERATION_PROMPT = "<|assistant|>\n"


def default_chat_text(turns: Sequence[ChatTurn]) -> str:
    rendered = "".join(DEFAULT_CHAT_TEMPLATE.format(role=t.role, content=t.content) for t in turns)
    return rendered + GENERATION_PROMPT


def synthetic_item(descriptor: ModelDescriptor) -> dict[str, Array]:
    """One item of zeros in every input (variable dimensions as 1): for warm-up and capacity measurement."""
    return {s.name: np.zeros([max(d, 1) for d in s.shape], dtype=s.dtype.numpy) for s in descriptor.inputs}


class GenerativeModel(abc.ABC):
    """An autoregressive model whose KV cache is one arena of tokens (server/kv): a sequence's keys and
    values for position p sit at token base + p of its region.

    The scheduler owns which region holds which sequence; the model only reads and writes those tokens.
    Every runtime prefills from any start (a cached prefix is already in the region).
    """

    descriptor: ModelDescriptor
    vocab_size: int
    eos_id: int | None
    device: torch.device
    kv: KvTensors
    #: Whether the tokenizer's decode() drops the space that begins a text (SentencePiece's dummy prefix):
    #: the streamed text then drops it too, so that joined it equals decode() of the same ids.
    strips_leading_space = False

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]:
        """Turns prompt text into token ids."""

    def chat_prompt(self, turns: Sequence[ChatTurn], tools: Sequence[Tool] = ()) -> list[int]:
        """A conversation as prompt tokens. Runtimes whose tokenizer has a chat template override this; the
        default renders DEFAULT_CHAT_TEMPLATE (tools as a first system turn, server/tools/format.py) and
        ends where the assistant speaks next."""
        return self.encode(default_chat_text(default_turns(turns, tools)))

    def tokenize(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Text as the Tokenize RPC gives it; `add_special_tokens` adds the tokenizer's own (a beginning of
        sequence), of which the default has none."""
        return self.encode(text)

    def chat_tokens(
        self, turns: Sequence[ChatTurn], tools: Sequence[Tool] = (), *, add_generation_prompt: bool = True
    ) -> list[int]:
        """A conversation as the Tokenize RPC gives it: chat_prompt's tokens, or (no generation prompt) the
        turns alone. A runtime with a template of its own that cannot leave the generation prompt out says
        so rather than count the wrong tokens."""
        if add_generation_prompt:
            return self.chat_prompt(turns, tools)
        if type(self).chat_prompt is not GenerativeModel.chat_prompt:
            raise InvalidArgument(
                f"{self.descriptor.name} renders a conversation only up to the generation prompt",
                field="add_generation_prompt",
            )
        return self.encode(default_chat_text(default_turns(turns, tools)).removesuffix(GENERATION_PROMPT))

    def detokenize(self, token_ids: Sequence[int]) -> str:
        """The text of token ids (the Detokenize RPC): their bytes, a partial character shown as U+FFFD."""
        return b"".join(self.token_bytes(t) for t in token_ids).decode("utf-8", errors="replace")

    @abc.abstractmethod
    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for (b"" for special tokens); the scheduler detokenises incrementally."""

    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes of one token, so the server can size the arena from a byte budget."""
        return self.kv.bytes_per_token()

    def allocate_cache(self, tokens: int) -> int:
        """Preallocates the KV arena of `tokens` tokens; returns its bytes."""
        return self.kv.allocate(tokens)

    def move_kv(self, moves: list[tuple[int, int, int]]) -> None:
        """Copies (source, destination, tokens) of keys and values, in order: compaction, cached prefixes."""
        self.kv.copy(moves)

    @abc.abstractmethod
    def prefill(self, base: int, token_ids: Sequence[int], start: int = 0) -> torch.Tensor:
        """Writes the tokens' keys/values at positions start.. of the region at `base`; returns the last
        position's logits, shape [V]."""

    def prefill_many(self, prompts: Sequence[Prefill]) -> torch.Tensor:
        """Prefills several at once; returns each one's last logits, shape [N, V]. Runtimes that can batch
        prompts override this; the default prefills one by one."""
        return torch.stack([self.prefill(p.base, p.token_ids, p.start) for p in prompts])

    @abc.abstractmethod
    def decode(self, bases: Sequence[int], tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One decode step: token b sits at positions[b] of the region at bases[b]; logits [B, V]."""

    #: Whether the scheduler may split a long prompt into chunks of its per-step token budget. Where False,
    #: every Prefill it sends is the rest of a prompt.
    chunked_prefill = False
    #: Whether the runtime attends a prefix held in another region (Prefill.shared, StepBatch.prefixes;
    #: step_attention.py): the scheduler then references cached prefixes instead of copying them.
    shares_prefixes = False

    #: The LoRA adapters this replica serves, by name: replaced whole, never mutated, by server/adapters.py
    #: (a step or a submission reads one consistent table without a lock).
    adapters: Mapping[str, LoraAdapter] = MappingProxyType({})

    def read_adapter(self, name: str, path: Path, limits: LoraLimits) -> LoraAdapter:
        """The PEFT adapter at `path`, on this replica's device, checked against this model (AdapterError
        naming the file, the rank or the target modules where it cannot be served). Runtimes that apply
        adapters in their step override this."""
        raise AdapterError(f"model {self.descriptor.name} cannot serve LoRA adapters (its runtime has none)")

    def adapters_changed(self) -> None:
        """Called off the event loop after `adapters` is replaced (a load or an unload): a runtime that
        prepares the loaded adapters together (runtimes/lora_stack.py's banks) does it here, beside the
        running steps."""
        return  # a runtime without adapters has nothing to prepare

    def step(self, batch: StepBatch, *, computing: Callable[[], None] = lambda: None) -> torch.Tensor:
        """One scheduler step (server/batching/step.py calls this): logits [N, V] in `batch`'s row order. The
        default runs forward(); a runtime that reads a row's extras (an adapter slot) overrides this."""
        return self.forward(batch.prefills, batch.bases, batch.tokens, batch.positions, computing=computing)

    def forward(
        self,
        prefills: Sequence[Prefill],
        bases: Sequence[int],
        tokens: torch.Tensor,
        positions: torch.Tensor,
        *,
        computing: Callable[[], None] = lambda: None,
    ) -> torch.Tensor:
        """One scheduler step: the prefills, then one decode token per region. Returns logits [N, V] for the
        prefills that end their prompt, then for each decode row. The default runs prefill_many and decode;
        a runtime that fuses both into one pass overrides it.

        `computing` is called once, where the step's Python is done and its long torch call begins: the
        scheduler hands the previous step's tokens to the event loop there, so that the loop's burst of
        delivery runs while this thread needs no GIL (server/batching/worker.py)."""
        computing()
        parts = []
        if prefills:
            parts.append(self.prefill_many(prefills))
        if bases:
            parts.append(self.decode(bases, tokens, positions))
        if not parts:
            raise RuntimeError("a step needs at least one sequence")
        return parts[0] if len(parts) == 1 else torch.cat(parts)
