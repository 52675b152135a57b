"""A grammar matcher that fails (issue 36, item 2), with real llguidance matchers: the failure is kept on the
row's state whether it comes while the matcher takes a token or while it computes the mask, the row's mask
then allows EOS only, and delivery ends the stream with the error (a limit outgrown: INVALID_ARGUMENT /
CONSTRAINT_TOO_COMPLEX; anything else: INTERNAL / CONSTRAINT_FAILED), counted, instead of as `stop`."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import llguidance
import numpy as np
import pytest
import torch

from server.batching.delivery import Delivery
from server.batching.sequence import GenSequence
from server.batching.stream import TokenStream
from server.batching.text import TextAssembler
from server.domain import FinishReason, SamplingParams
from server.logits import apply
from server.logits.grammar import LIMITS
from server.logits.state import RowState
from server.logits.vocab import grammar_tokenizer
from server.metrics import Metrics

VOCAB, EOS = 257, 256  # bytes and EOS
MODEL: Any = SimpleNamespace(
    eos_id=EOS,
    vocab_size=VOCAB,
    token_bytes=lambda i: bytes((i,)) if i < 256 else b"",
    encode=lambda text: list(text.encode()),
    descriptor=SimpleNamespace(name="byte-lm"),
)


def _state(lark: str, limits: llguidance.LLParserLimits = LIMITS) -> RowState:
    matcher = llguidance.LLMatcher(grammar_tokenizer(MODEL), lark, log_level=0, limits=limits)
    assert not matcher.is_error()
    return RowState(vocab_size=VOCAB, device=torch.device("cpu"), prompt=[1], matcher=matcher)


def _step(state: RowState) -> tuple[set[int], dict[int, str]]:
    """One step's masks for the row: the tokens allowed, and the failures the step reports."""
    rows: apply.Rows = [(0, state, len(state.tokens))]
    masks = apply.start(rows, VOCAB, EOS)
    logits = torch.zeros(1, VOCAB)
    apply.process(logits, rows, masks)
    return set(np.flatnonzero(logits[0].numpy() == 0)), apply.failures(rows)


def test_a_token_the_grammar_cannot_take_is_kept_as_the_rows_failure() -> None:
    state = _state('start: "abc"')
    assert _step(state) == ({ord("a")}, {})
    state.accept(ord("z"))  # as a token beyond the mask's width would be
    allowed, failures = _step(state)
    assert allowed == {EOS}
    assert "doesn't satisfy the grammar" in failures[0] and "\n" not in failures[0]
    assert _step(state)[1] == failures  # kept: every later step reports it


def test_a_mask_that_outgrows_the_step_lexer_fuel_is_a_failure() -> None:
    tiny = llguidance.LLParserLimits(step_lexer_fuel=10, initial_lexer_fuel=250_000)
    state = _state(llguidance.LLMatcher.grammar_from_regex("[a-z]{0,40}x[a-z]{10}"), tiny)
    assert _step(state)[1] == {}
    state.accept(ord("q"))
    allowed, failures = _step(state)
    assert allowed == {EOS} and "too many expressions" in failures[0]


@pytest.mark.parametrize(
    ("failure", "code", "reason"),
    [
        (
            "Parser Error: Current row has 2001 items; max is 2000",  # llguidance 1.9.1's words
            "INVALID_ARGUMENT",
            "CONSTRAINT_TOO_COMPLEX",
        ),
        ("lexer error: too many expressions constructed", "INVALID_ARGUMENT", "CONSTRAINT_TOO_COMPLEX"),
        ('Parser Error: token "z" doesn\'t satisfy the grammar', "INTERNAL", "CONSTRAINT_FAILED"),
    ],
)
def test_delivery_ends_the_stream_with_the_error_not_stop(failure: str, code: str, reason: str) -> None:
    metrics = Metrics()
    delivery = Delivery(MODEL, context_length=64, metrics=metrics)
    seq = GenSequence(
        [1],
        SamplingParams(max_tokens=16, stop=("!?",)),
        seed=0,
        stream=TokenStream(8, lambda: None),
        text=TextAssembler(("!?",)),
        arrived=0.0,
    )
    delivery.deliver(seq, ord("a"), 1, None)
    delivery.deliver(seq, ord("!"), 2, None)  # might begin the stop sequence: held back
    delivery.deliver(seq, EOS, 3, None, failure=failure)
    chunks, final = asyncio.run(seq.stream.take())
    assert "".join(c.text for c in chunks) == "a" and seq.done
    assert final is not None and final.text == "!"  # what was held back follows what was sent
    assert final is not None and final.finish_reason is FinishReason.ERROR and final.error is not None
    assert (final.error.code, final.error.reason) == (code, reason)
    assert failure in final.error.message and final.usage is not None and final.usage.completion_tokens == 2
    labels = {"model": "byte-lm", "reason": reason}
    assert metrics.registry.get_sample_value("sluice_constraint_failures_total", labels) == 1
