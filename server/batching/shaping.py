"""What shapes a sequence's output beyond sampling: its constraint (or the grammar of its tool calls)
compiled off the event loop, its logits state (server/logits) and its tool output (server/tools), with
strict functions' schemas checked up front. Sequences with none of them carry nothing and cost nothing per
step."""

from __future__ import annotations

import asyncio
import json

import llguidance

from server.batching.sequence import GenSequence
from server.domain import GenerateSpec
from server.errors import InvalidArgument, clip
from server.logits.grammar import GrammarCompiler
from server.logits.schema_check import SchemaCheck
from server.logits.state import RowState
from server.runtimes.base import GenerativeModel
from server.tools.format import parameters
from server.tools.grammar import tool_constraint
from server.tools.output import ArgumentCheck, ToolOutput
from wire.constraint import Constraint


def effective_constraint(spec: GenerateSpec) -> Constraint | None:
    """The request's constraint, or the grammar of the tool call it requires."""
    if spec.constraint is not None:
        return spec.constraint
    if spec.tools:
        return tool_constraint(spec.tools, spec.tool_choice, parallel=spec.parallel_tool_calls)
    return None


def _strict_schemas(spec: GenerateSpec) -> list[tuple[int, str]]:
    """(index, schema text) of each strict function a call may be made to."""
    if spec.tool_choice.mode == "none":
        return []
    return [(i, json.dumps(parameters(t))) for i, t in enumerate(spec.tools) if t.strict]


class OutputShaping:
    def __init__(self, model: GenerativeModel) -> None:
        self.model = model
        self.grammars = GrammarCompiler(model)
        self.schemas = SchemaCheck()

    def check_strict(self, spec: GenerateSpec) -> None:
        """Refuses a strict function whose schema cannot be enforced, naming it (OpenAI's strict is a
        guarantee: what cannot be kept is refused). A compile the first time (~1 ms), then cached."""
        for index, schema in _strict_schemas(spec):
            try:
                self.schemas.template(schema)
            except InvalidArgument as error:  # or LimitExceeded, kept as it is: only the field changes
                raise type(error)(
                    f"function {clip(spec.tools[index].name)!r} is strict, but its parameters cannot be "
                    f"enforced ({error.message})",
                    field=f"tools[{index}].parameters_json",
                    metadata={k: v for k, v in error.metadata.items() if k != "field"},
                ) from None

    async def prepare(self, spec: GenerateSpec) -> llguidance.LLMatcher | None:
        """The request's matcher, compiled on a thread (or copied from the cache); size limits are checked
        here first, so an oversize constraint is refused without compiling anything."""
        if _strict_schemas(spec):
            await asyncio.to_thread(self.check_strict, spec)
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
        self.check_strict(spec)  # cached where prepare ran
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
            seq.tools = ToolOutput(
                names, required=spec.tool_choice.mode == "required", check=self._unmasked_check(spec)
            )

    def _unmasked_check(self, spec: GenerateSpec) -> ArgumentCheck | None:
        """Where the caller's own constraint, not the tool grammar, masks an `auto` generation, a strict
        function's call is reported only if its arguments are valid (else it is released as text)."""
        strict = {spec.tools[i].name: schema for i, schema in _strict_schemas(spec)}
        if spec.constraint is None or spec.tool_choice.mode != "auto" or not strict:
            return None
        schemas = self.schemas
        return lambda name, arguments: name not in strict or schemas.valid(strict[name], arguments)
