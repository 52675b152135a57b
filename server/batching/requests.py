"""Generate requests against the server's and the model's limits: stop sequences, prompt tokens, max_tokens
and the context length, defaults for unset sampling settings. A request that can never fit is refused here,
naming the limit."""

from __future__ import annotations

from dataclasses import dataclass

from server.domain import GenerateSpec, SamplingParams
from server.errors import InvalidArgument, LimitExceeded
from server.runtimes.base import GenerativeModel
from wire.sampling import Sampling


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What one Generate request may ask of a scheduler (from Settings and the model's context)."""

    context_length: int
    default_max_tokens: int
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
    default_max_tokens = min(limits.default_max_tokens, context - 1)
    if spec.prompt_ids is not None:
        prompt = list(spec.prompt_ids)
        for index, token in enumerate(prompt):
            if not 0 <= token < model.vocab_size:
                raise InvalidArgument(
                    f"token id {token} is outside the vocabulary [0, {model.vocab_size})",
                    field=f"token_ids.ids[{index}]",
                )
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
    min_tokens = asked.min_tokens or 0
    if not 0 <= min_tokens <= max_tokens:
        raise InvalidArgument(
            f"min_tokens must be between 0 and max_tokens ({max_tokens}), got {min_tokens}",
            field="sampling.min_tokens",
        )
    _check_token_ids(asked, model.vocab_size)
    # A grammar decides where the output may end: a constraint, a required call, or auto with a strict
    # function (the tool grammar, where the caller gave no constraint).
    mode = spec.tool_choice.mode
    grammar = mode == "required" or (mode == "auto" and any(t.strict for t in spec.tools))
    if asked.ignore_eos and (spec.constraint is not None or grammar):
        raise InvalidArgument("ignore_eos cannot be combined with a constraint", field="sampling.ignore_eos")
    params = SamplingParams(
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=asked.ignore_eos,
        logprobs=asked.logprobs,
        temperature=1.0 if asked.temperature is None else asked.temperature,
        top_p=1.0 if asked.top_p is None else asked.top_p,
        top_k=asked.top_k or 0,
        seed=asked.seed,
        stop=asked.stop,
        stop_token_ids=frozenset(asked.stop_token_ids),
    )
    return prompt, params


def _check_token_ids(asked: Sampling, vocab_size: int) -> None:
    for token, _ in asked.logit_bias:
        if not 0 <= token < vocab_size:
            raise InvalidArgument(
                f"token id {token} is outside the vocabulary [0, {vocab_size})",
                field=f"sampling.logit_bias[{token}]",
            )
    for index, token in enumerate(asked.stop_token_ids):
        if not 0 <= token < vocab_size:
            raise InvalidArgument(
                f"token id {token} is outside the vocabulary [0, {vocab_size})",
                field=f"sampling.stop_token_ids[{index}]",
            )
