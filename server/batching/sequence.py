"""GenSequence: the state of one generation as the continuous scheduler moves it through its steps."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from server.batching.stream import TokenStream
from server.batching.text import TextAssembler
from server.domain import SamplingParams, Usage


@dataclass(eq=False, slots=True)
class GenSequence:
    """One generation's state; `position` counts the tokens already written to its KV slot once the prompt
    is in (`prefilled` counts the prompt tokens written so far, chunk by chunk)."""

    prompt: list[int]
    params: SamplingParams
    seed: int
    stream: TokenStream
    text: TextAssembler
    arrived: float
    slot: int | None = None
    position: int = 0
    prefilled: int = 0
    last_token: int = -1
    generated: int = 0
    cancel_step: int | None = None
    paused_since: float | None = None
    done: bool = False
    on_release: Callable[[], None] | None = None  # called once its KV slot is free (admission's slot)

    def usage(self) -> Usage:
        return Usage(prompt_tokens=len(self.prompt), completion_tokens=self.generated)
