"""Logits processing state (server/logits): a matcher rolled back over discarded tokens is where a fresh
one fed only the kept tokens is; penalties count what was kept; the tool-output splitter shows text up
to the call tag, holds a tag that may be starting, and parses calls (complete ones only at max_tokens)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from server.logits import apply
from server.logits.grammar import GrammarCompiler, to_grammar
from server.logits.state import RowState
from server.tools.output import ToolOutput, parse_calls
from wire.constraint import Constraint

VOCAB = 257  # bytes and EOS
MODEL: Any = SimpleNamespace(
    eos_id=256,
    vocab_size=VOCAB,
    token_bytes=lambda i: bytes((i,)) if i < 256 else b"",
    encode=lambda text: list(text.encode()),
)
SCHEMA = Constraint.json_schema(json.dumps({"type": "object", "properties": {"ab": {"type": "integer"}}}))


def _state(constraint: Constraint = SCHEMA, **kw: Any) -> RowState:
    matcher = GrammarCompiler(MODEL).matcher(constraint)
    return RowState(vocab_size=VOCAB, device=torch.device("cpu"), prompt=[1, 2, 3], matcher=matcher, **kw)


def _mask(state: RowState, generated: int) -> np.ndarray:
    future = apply.start([(0, state, generated)], VOCAB, MODEL.eos_id)
    assert future is not None
    return future.result()


def test_a_rolled_back_matcher_masks_as_a_fresh_one_fed_the_kept_tokens() -> None:
    kept, discarded = list(b'{"ab": 1'), list(b"2")
    rolled = _state()
    for token in kept + discarded:
        rolled.accept(token)
    _mask(rolled, len(kept) + 1)  # the matcher took every token, the discarded one too
    fresh = _state()
    for token in kept:
        fresh.accept(token)
    assert np.array_equal(_mask(rolled, len(kept)), _mask(fresh, len(kept)))
    assert rolled.tokens == kept and rolled.consumed == len(kept)


def test_eos_is_allowed_exactly_where_the_text_may_end() -> None:
    state = _state(Constraint.choice(["ab", "abc"]))
    allowed = lambda: set(np.flatnonzero(_mask(state, len(state.tokens)) == 0))  # noqa: E731
    assert allowed() == {ord("a")}
    state.accept(ord("a"))
    assert allowed() == {ord("b")}
    state.accept(ord("b"))
    assert allowed() == {ord("c"), MODEL.eos_id}
    state.accept(ord("c"))
    assert allowed() == {MODEL.eos_id}


def test_penalties_count_only_kept_tokens() -> None:
    state = RowState(vocab_size=VOCAB, device=torch.device("cpu"), prompt=[7], frequency=1.0, repetition=2.0)
    for token in (5, 5, 6):
        state.accept(token)
    state.sync(2)  # the 6 was discarded
    logits = torch.ones(1, VOCAB)
    apply.process(logits, [(0, state, 2)], None)
    assert logits[0, 5].item() == 0.5 - 2  # divided by the repetition penalty, then 2 occurrences
    assert logits[0, 7].item() == 0.5  # in the prompt: repetition only
    assert logits[0, 6].item() == 1.0


def test_choice_options_are_quoted_into_the_grammar() -> None:
    """Quotes and backslashes in an option are the option's own characters, not the grammar's syntax."""
    options = ['say "hi"', "back\\slash"]
    assert "say" in to_grammar(Constraint.choice(options))
    for option in [*options, "say hi"]:
        state = _state(Constraint.choice(options))
        taken = True
        for i, token in enumerate(option.encode()):
            taken = taken and _mask(state, i)[0, token] == 0
            state.accept(token)
        ends = _mask(state, len(option.encode()))[0, MODEL.eos_id] == 0
        assert (taken and ends) == (option in options), option


def test_tool_output_shows_text_up_to_the_tag_and_parses_the_calls() -> None:
    out = ToolOutput(frozenset({"f"}), required=False)
    assert out.feed("Sure. <tool") == "Sure. "  # a tag that may be starting is held back
    assert out.feed("_call>\n") == ""
    assert out.feed('{"name": "f", "arguments": {"x": 1}}\n</tool_call>') == ""
    text, calls = out.finish()
    assert text == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"x": 1})]
    held = ToolOutput(frozenset({"f"}), required=False)
    assert held.feed("a <b") == "a <b"  # not the tag's start: shown at once
    assert held.feed(" <too") == " "
    assert held.finish() == ("<too", ())  # the stream ended: what was held is text


def test_an_incomplete_or_unknown_call_is_released_as_text() -> None:
    names = frozenset({"f"})
    assert parse_calls('<tool_call>{"name": "g", "arguments": {}}</tool_call>', names) == ((), False)
    complete = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    calls, whole = parse_calls(complete + "<tool_call>{", names)
    assert len(calls) == 1 and not whole
    out = ToolOutput(names, required=True)
    out.feed(complete + "<tool_call>{")
    assert out.finish()[1] == ()  # an ending by EOS with a broken call: text
    out = ToolOutput(names, required=True)
    out.feed(complete + "<tool_call>{")
    assert len(out.finish(cut=True)[1]) == 1  # cut by max_tokens: the complete calls count
