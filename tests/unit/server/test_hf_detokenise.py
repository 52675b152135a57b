"""Issue 10, point 4: Sluice's streamed text (per token `TextAssembler.feed(checkpoint.token_bytes[id])`, then
`flush()`), joined, equals `tokenizer.decode(ids, skip_special_tokens=True)`, for a byte-level BPE tokenizer
(GPT-2 / Llama 3 / Qwen2) and a SentencePiece-style byte-fallback one (Llama 2 / Mistral), both trained here,
offline, on a small corpus with multi-byte characters; and stop sequences still match across tokens."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import LlamaConfig, PreTrainedTokenizerFast

from server.batching.text import TextAssembler
from server.runtimes.hf_checkpoint import HfCheckpoint

CORPUS = [
    "héllo wörld — naïve café 日本語 🙂",
    "hello world, the naïve café is open",
    "日本語のテキスト and an emoji 🙂🙂 in a sentence",
    "wörld peace: crème brûlée, jalapeño, Ærø",
] * 4
BYTE_PIECE = re.compile(r"<0x[0-9A-F]{2}>")


def byte_level() -> tuple[Tokenizer, dict[str, str]]:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=alphabet)
    tokenizer.train_from_iterator(CORPUS, trainer)
    return tokenizer, {"eos_token": "<|endoftext|>"}


def sentencepiece_style() -> tuple[Tokenizer, dict[str, str]]:
    special = ["<unk>", "<s>", "</s>"]
    normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.normalizer = normalizer
    trained.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=120, special_tokens=special))
    vocab = trained.get_vocab()  # specials first: <unk> 0, <s> 1, </s> 2
    for byte in range(256):  # the byte tokens are ordinary vocabulary, as in Llama 2's, not special tokens
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    merges = [(left, right) for left, right in json.loads(trained.to_str())["model"]["merges"]]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>"))
    tokenizer.normalizer = normalizer
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tokenizer.add_special_tokens(special)
    return tokenizer, {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}


def save_checkpoint(build: Callable[[], tuple[Tokenizer, dict[str, str]]], path: Path) -> HfCheckpoint:
    tokenizer, specials = build()
    # clean_up_tokenization_spaces=False: else decode() would also rewrite " ," and the like, which
    # Sluice does not (nor do Llama's or Qwen2's own tokenizers).
    wrapped = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # transformers leaves it untyped
        tokenizer_object=tokenizer, clean_up_tokenization_spaces=False, **specials
    )
    wrapped.save_pretrained(path)
    LlamaConfig(
        vocab_size=len(wrapped),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=64,
    ).save_pretrained(path)
    loaded = HfCheckpoint(path, context_length=64)
    assert len(loaded.token_bytes) == len(wrapped) and loaded.eos_id == wrapped.eos_token_id
    return loaded


@pytest.fixture(scope="module", params=[byte_level, sentencepiece_style], ids=["byte-level", "sentencepiece"])
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> HfCheckpoint:
    return save_checkpoint(request.param, tmp_path_factory.mktemp(request.param.__name__))


def streamed(checkpoint: HfCheckpoint, ids: list[int]) -> str:
    assembler = TextAssembler((), strip_leading_space=checkpoint.strips_leading_space)
    parts = [assembler.feed(checkpoint.token_bytes[token])[0] for token in ids]
    return "".join(parts) + assembler.flush()


def decoded(checkpoint: HfCheckpoint, ids: list[int]) -> str:
    return str(checkpoint.tokenizer.decode(ids, skip_special_tokens=True))


def valid_byte_runs(checkpoint: HfCheckpoint, ids: list[int]) -> bool:
    """Whether each run of <0xNN> tokens (special tokens skipped) is valid UTF-8; see the xfail below."""
    runs = [b""]
    for piece in checkpoint.tokenizer.convert_ids_to_tokens(ids):
        if piece in checkpoint.tokenizer.all_special_tokens:
            continue
        if BYTE_PIECE.fullmatch(piece):
            runs[-1] += bytes((int(piece[3:5], 16),))
        else:
            runs.append(b"")
    return all(_is_utf8(data) for data in runs)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def id_sequences(checkpoint: HfCheckpoint) -> list[list[int]]:
    rng = random.Random(10)
    vocab = len(checkpoint.token_bytes)
    byte_token = {data[0]: token for token, data in enumerate(checkpoint.token_bytes) if len(data) == 1}
    spaced = [
        token for token, data in enumerate(checkpoint.token_bytes) if data[:1] == b" " and len(data) > 1
    ]
    assert len(byte_token) == 256 and spaced  # every byte is some token's
    sequences = [
        checkpoint.encode(text) for text in [*CORPUS[:4], " leading space", "  two", "x  y ", "+~ zq"]
    ]
    sequences += [[rng.randrange(vocab) for _ in range(rng.randint(1, 12))] for _ in range(1500)]
    sequences += [[rng.choice(spaced), *rng.sample(range(vocab), 3)] for _ in range(200)]
    for _ in range(300):  # characters split into their bytes, one token each, between random tokens
        ids = [rng.randrange(vocab)]
        for char in rng.choices("éö—日本語🙂ïæ", k=3):
            ids += [byte_token[b] for b in char.encode()] + [rng.randrange(vocab)]
        sequences.append(ids)
    return sequences


def test_each_token_alone_streams_as_it_decodes(checkpoint: HfCheckpoint) -> None:
    pieces = checkpoint.tokenizer.convert_ids_to_tokens(list(range(len(checkpoint.token_bytes))))
    ids = [token for token, piece in enumerate(pieces) if not BYTE_PIECE.fullmatch(piece)]
    cases = [
        (token, pieces[token], decoded(checkpoint, [token]), streamed(checkpoint, [token])) for token in ids
    ]
    assert [case for case in cases if case[2] != case[3]] == []


def test_streamed_text_joins_to_the_tokenizers_decode(checkpoint: HfCheckpoint) -> None:
    drawn = id_sequences(checkpoint)
    sequences = [ids for ids in drawn if valid_byte_runs(checkpoint, ids)]
    assert len(sequences) > 300
    cases = [(ids, decoded(checkpoint, ids), streamed(checkpoint, ids)) for ids in sequences]
    assert [case for case in cases if case[1] != case[2]] == []
    # Invalid UTF-8 did occur: compared here (byte-level), or left out for the xfail below (byte fallback).
    assert any("\ufffd" in text for _, text, _ in cases) or len(sequences) < len(drawn)
    assert any(ids and checkpoint.token_bytes[ids[0]].startswith(b" ") for ids in sequences)


@pytest.mark.xfail(
    strict=True,
    reason="decode()'s ByteFallback turns every <0xNN> token of an invalid UTF-8 run into U+FFFD, valid "
    "ASCII bytes included; Sluice decodes the bytes with Python's 'replace' (one U+FFFD per invalid part)",
)
def test_an_invalid_byte_fallback_run_decodes_as_the_tokenizer_does(tmp_path: Path) -> None:
    checkpoint = save_checkpoint(sentencepiece_style, tmp_path)
    ids: list[Any] = checkpoint.tokenizer.convert_tokens_to_ids(["a", "<0x2B>", "<0xE6>", "<0x97>", "b"])
    assert decoded(checkpoint, ids) == "a\ufffd\ufffd\ufffdb"  # what the tokenizer gives
    assert streamed(checkpoint, ids) == decoded(checkpoint, ids)  # Sluice gives "a+\ufffdb"


def test_strips_leading_space_only_for_sentencepiece(checkpoint: HfCheckpoint) -> None:
    sentencepiece = checkpoint.tokenizer.backend_tokenizer.normalizer is not None
    assert checkpoint.strips_leading_space is sentencepiece
    # SentencePiece encodes "hello" as "▁hello..." and decode() drops that space; byte-level keeps " hello".
    text = "hello" if sentencepiece else " hello"
    ids = checkpoint.encode(text)
    assert checkpoint.token_bytes[ids[0]].startswith(b" ") and decoded(checkpoint, ids) == text
    assert streamed(checkpoint, ids) == text


def test_a_stop_split_across_tokens_still_stops(checkpoint: HfCheckpoint) -> None:
    text = "héllo zwörp naïve"  # "zwörp" is not in the corpus, so "wör" is no single token
    ids = checkpoint.encode(text)
    stop = "wör".encode()
    assert stop in b"".join(checkpoint.token_bytes[token] for token in ids)
    assert not any(stop in checkpoint.token_bytes[token] for token in ids)  # the stop spans tokens
    assembler = TextAssembler(("wör",), strip_leading_space=checkpoint.strips_leading_space)
    emitted, stopped = [], False
    for token in ids:
        part, stopped = assembler.feed(checkpoint.token_bytes[token])
        emitted.append(part)
        if stopped:
            break
    assert stopped and "".join(emitted) == "héllo z"
