"""Tokenize and Detokenize below the RPCs: the codec's checks (a prompt, tools only with a conversation, the
generation prompt on unless asked off) and what a runtime gives (the default template with and without the
generation prompt; bytes back to text; ids outside the vocabulary refused naming their position)."""

from __future__ import annotations

import pytest
import torch
from sluice.inference.v1 import inference_pb2 as pb

from server.codec.tokens import decode_tokenize
from server.domain import ChatTurn, TokenizeSpec
from server.errors import InvalidArgument
from server.runtimes.base import default_chat_text
from server.runtimes.byte_lm import ByteLm
from server.submission import detokenize, tokenize

CHAT = pb.ChatPrompt(messages=[pb.ChatMessage(role="user", content="hi")])


def test_the_codec_checks_what_needs_no_model() -> None:
    with pytest.raises(InvalidArgument) as none:
        decode_tokenize(pb.TokenizeRequest(model="m"))
    assert none.value.field == "text"
    with pytest.raises(InvalidArgument) as tools:
        decode_tokenize(pb.TokenizeRequest(model="m", text="x", tools=[pb.Tool(name="f")]))
    assert tools.value.field == "tools"
    with pytest.raises(InvalidArgument) as role:
        decode_tokenize(
            pb.TokenizeRequest(model="m", chat=pb.ChatPrompt(messages=[pb.ChatMessage(role="x")]))
        )
    assert role.value.field == "chat.messages[0].role"
    spec = decode_tokenize(pb.TokenizeRequest(model="m", chat=CHAT))
    assert spec.add_generation_prompt and spec.chat == (ChatTurn("user", "hi"),)
    off = decode_tokenize(pb.TokenizeRequest(model="m", chat=CHAT, add_generation_prompt=False))
    assert not off.add_generation_prompt
    assert decode_tokenize(pb.TokenizeRequest(model="m", text="")).text == ""


def test_a_runtime_tokenizes_as_generate_does_and_detokenizes_back() -> None:
    lm = ByteLm(size="tiny", context_length=64, max_sequences=1, device=torch.device("cpu"))
    turns = (ChatTurn("user", "hi"),)
    rendered = default_chat_text(list(turns))
    assert tokenize(lm, TokenizeSpec("byte-lm", None, turns)) == list(rendered.encode())
    assert tokenize(lm, TokenizeSpec("byte-lm", None, turns)) == lm.chat_prompt(turns)
    bare = tokenize(lm, TokenizeSpec("byte-lm", None, turns, add_generation_prompt=False))
    assert bytes(bare).decode() == "<|user|>\nhi\n"
    ids = tokenize(lm, TokenizeSpec("byte-lm", "héllo"))
    assert detokenize(lm, ids) == "héllo" and detokenize(lm, ids[:2]) == "h\ufffd"
    with pytest.raises(InvalidArgument) as outside:
        detokenize(lm, [1, lm.vocab_size])
    assert outside.value.field == "token_ids[1]"
