"""Generate requests against the server's and the model's limits: stop sequences, prompt tokens, max_tokens
and the context length, the default max_tokens (the context's remainder unless an operator caps it). A
request that can never fit is refused here, naming the limit. Sampling's own ranges were checked when it
was decoded (wire/sampling.py)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from server.domain import GenerateSpec, SamplingParams
from server.errors import InvalidArgument, LimitExceeded
from server.runtimes.base import GenerativeModel


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What one Generate request may ask of a scheduler (from Settings and the model's context)."""

    context_length: int
    default_max_tokens: int | None = None  # None: the context's remainder (OpenAI's, vLLM's default)
    # OpenAI and TGI allow 4 stop sequences; their text is held back while it could still become one.
    max_stop_sequences: int = 4
    max_stop_chars: int = 128


def check_stops(stops: tuple[str, ...], limits: RequestLimits) -> None:
    """Counts first, so an oversize list is refused without looking at its entries."""
    if len(stops) > limits.max_stop_sequences:
        raise LimitExceeded(
            f"{len(stops)} stop sequences; at most {limits.max_stop_sequences} are allowed",
            field="sampling.stop",
            metadata={"max_stop_sequences": limits.max_stop_sequences, "stop_sequences": len(stops)},
        )
    for index, stop in enumerate(stops):
        if not stop:
            raise InvalidArgument("stop sequences must not be empty", field=f"sampling.stop[{index}]")
        if len(stop) > limits.max_stop_chars:
            raise LimitExceeded(
                f"stop sequence {index} has {len(stop)} characters; at most {limits.max_stop_chars}",
                field=f"sampling.stop[{index}]",
                metadata={"max_stop_chars": limits.max_stop_chars},
            )


def resolve_request(
    spec: GenerateSpec, model: GenerativeModel, limits: RequestLimits
) -> tuple[list[int], SamplingParams]:
    """The prompt's token ids and complete sampling settings; raises InvalidArgument / LimitExceeded naming
    the field before the stream starts."""
    asked = spec.sampling
    check_stops(asked.stop, limits)
    model_limits = model.descriptor.limits
    context = limits.context_length
    default_max_tokens = min(limits.default_max_tokens or context, context - 1)
    if spec.prompt_ids is not None:
        prompt = list(spec.prompt_ids)
        check_vocabulary(prompt, model.vocab_size, "token_ids.ids")
        prompt_field = "token_ids.ids"
    elif spec.prompt_chat is not None:
        prompt = model.chat_prompt(spec.prompt_chat, spec.tools)
        prompt_field = "chat.messages"
    else:
        prompt = model.encode(spec.prompt_text or "")
        prompt_field = "text"
    if len(prompt) >= context:
        raise LimitExceeded(
            f"the prompt has {len(prompt)} tokens; context_length is {context}",
            field=prompt_field,
            metadata={"context_length": context, "prompt_tokens": len(prompt)},
        )
    if asked.max_tokens is None:
        max_tokens = min(default_max_tokens, context - len(prompt))
    else:
        max_tokens = asked.max_tokens
        if max_tokens > model_limits.max_tokens:
            raise LimitExceeded(
                f"max_tokens {max_tokens} exceeds the model's limit of {model_limits.max_tokens}",
                field="sampling.max_tokens",
                metadata={"max_tokens_limit": model_limits.max_tokens},
            )
        if len(prompt) + max_tokens > context:
            raise LimitExceeded(
                f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceeds context_length {context}",
                field="sampling.max_tokens",
                metadata={"context_length": context, "prompt_tokens": len(prompt)},
            )
    params = SamplingParams.resolved(asked, max_tokens=max_tokens)
    if not 0 <= params.min_tokens <= max_tokens:
        raise InvalidArgument(
            f"min_tokens must be between 0 and max_tokens ({max_tokens}), got {params.min_tokens}",
            field="sampling.min_tokens",
        )
    check_vocabulary((t for t, _ in asked.logit_bias), model.vocab_size, "sampling.logit_bias", by_token=True)
    check_vocabulary(asked.stop_token_ids, model.vocab_size, "sampling.stop_token_ids")
    # A grammar decides where the output may end: a constraint, a required call, or auto with a strict
    # function (the tool grammar, where the caller gave no constraint).
    mode = spec.tool_choice.mode
    grammar = mode == "required" or (mode == "auto" and any(t.strict for t in spec.tools))
    if asked.ignore_eos and (spec.constraint is not None or grammar):
        raise InvalidArgument("ignore_eos cannot be combined with a constraint", field="sampling.ignore_eos")
    return prompt, params


def check_vocabulary(tokens: Iterable[int], vocab_size: int, field: str, *, by_token: bool = False) -> None:
    """Every token id is in the vocabulary; the first that is not is refused as `field[position]` (or, with
    `by_token`, as `field[token]`: logit_bias is a map keyed by the token id)."""
    for index, token in enumerate(tokens):
        if not 0 <= token < vocab_size:
            raise InvalidArgument(
                f"token id {token} is outside the vocabulary [0, {vocab_size})",
                field=f"{field}[{token if by_token else index}]",
            )
