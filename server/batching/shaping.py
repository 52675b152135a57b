"""What shapes a sequence's output beyond sampling: its constraint (or the grammar of a required tool
call) compiled off the event loop, its logits state (server/logits) and its tool output (server/tools).
Sequences with none of them carry nothing and cost nothing per step."""

from __future__ import annotations

import asyncio

import llguidance

from server.batching.sequence import GenSequence
from server.domain import GenerateSpec
from server.logits.grammar import GrammarCompiler
from server.logits.state import RowState
from server.runtimes.base import GenerativeModel
from server.tools.grammar import tool_constraint
from server.tools.output import ToolOutput
from wire.constraint import Constraint


def effective_constraint(spec: GenerateSpec) -> Constraint | None:
    """The request's constraint, or the grammar of the tool call it requires."""
    if spec.constraint is not None:
        return spec.constraint
    if spec.tools:
        return tool_constraint(spec.tools, spec.tool_choice, parallel=spec.parallel_tool_calls)
    return None


class OutputShaping:
    def __init__(self, model: GenerativeModel) -> None:
        self.model = model
        self.grammars = GrammarCompiler(model)

    async def prepare(self, spec: GenerateSpec) -> llguidance.LLMatcher | None:
        """The request's matcher, compiled on a thread (or copied from the cache); size limits are checked
        here first, so an oversize constraint is refused without compiling anything."""
        constraint = effective_constraint(spec)
        if constraint is None:
            return None
        self.grammars.check(constraint)
        # A cached constraint is copied here: a hop to a thread would let the request miss the next step.
        cached = self.grammars.cached(constraint)
        return cached if cached is not None else await asyncio.to_thread(self.grammars.matcher, constraint)

    def attach(self, seq: GenSequence, spec: GenerateSpec, matcher: llguidance.LLMatcher | None) -> None:
        """Gives the sequence its logits state and tool output; compiles here (bounded by the limits) when
        the caller did not prepare."""
        if matcher is None and (constraint := effective_constraint(spec)) is not None:
            matcher = self.grammars.matcher(constraint)
        asked = seq.params  # resolved: an unset penalty is at its declared default
        presence, frequency, repetition = (
            asked.presence_penalty,
            asked.frequency_penalty,
            asked.repetition_penalty,
        )
        if matcher is not None or presence or frequency or repetition != 1 or asked.logit_bias:
            seq.logits = RowState(
                vocab_size=self.model.vocab_size,
                device=self.model.device,
                prompt=seq.prompt,
                matcher=matcher,
                presence=presence,
                frequency=frequency,
                repetition=repetition,
                logit_bias=asked.logit_bias,
            )
        if spec.tools and spec.tool_choice.mode != "none":
            names = frozenset(t.name for t in spec.tools)
            seq.tools = ToolOutput(names, required=spec.tool_choice.mode == "required")
