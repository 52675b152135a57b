"""GenSequence: the state of one generation as the continuous scheduler moves it through its steps."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from server.batching.extras import RequestExtras
from server.batching.stream import TokenStream
from server.batching.text import TextAssembler
from server.domain import GenerateTimings, Priority, SamplingParams, Usage
from server.kv.arena import Region
from server.kv.prefix import FeedBlocks
from server.logits.state import RowState
from server.tools.output import ToolOutput


@dataclass(eq=False, slots=True)
class GenSequence:
    """One generation's state. `feed` is what goes into its KV region by prefill: the prompt, or after a
    preemption the prompt and every token already sent. `planned` counts the feed tokens handed to the
    model, `prefilled` those written (a cached prefix counts at once), `position` the tokens written once
    the feed is in. `epoch` counts preemptions: a row planned before one is discarded."""

    prompt: list[int]
    params: SamplingParams
    seed: int
    stream: TokenStream
    text: TextAssembler
    arrived: float
    priority: Priority = Priority.NORMAL
    deadline: float = math.inf  # monotonic; inf: none
    extras: RequestExtras = RequestExtras()  # noqa: RUF009 (frozen) - the salt, resolved once per request
    feed: list[int] = field(default_factory=list)
    blocks: FeedBlocks = field(default_factory=FeedBlocks)  # the prefix cache's hashes of the feed, once
    produced: list[int] = field(default_factory=list)  # the tokens sent, in order
    region: Region | None = None
    # Where the cache's region `shared` holds the feed's first `shared_tokens` (issue 37): `region` holds
    # only the positions after them, so position p sits at region.base + p - shared_tokens.
    shared: Region | None = None
    shared_tokens: int = 0
    position: int = 0
    planned: int = 0
    prefilled: int = 0
    epoch: int = 0
    last_token: int = -1
    generated: int = 0
    cached_tokens: int = 0  # prompt tokens the first admission took from the prefix cache
    cancel_step: int | None = None
    paused_since: float | None = None
    done: bool = False
    on_release: Callable[[], None] | None = None  # called once its KV region is given up (admission's slot)
    logits: RowState | None = None  # grammar, penalties, bias: touched only on the model's thread
    tools: ToolOutput | None = None  # where tools are given: the output is parsed for calls
    # Its timings' stamps (monotonic): admission's wait before `arrived`, the step that first took it and
    # that step's size, its first and latest tokens.
    admission_wait_s: float = 0.0
    scheduled: float = 0.0
    first_step: int = -1
    first_batch: int = 0
    first_token_at: float = 0.0
    last_token_at: float = 0.0

    @property
    def base(self) -> int:
        """Where position 0 would sit: position p's keys are at base + p (for p >= shared_tokens)."""
        assert self.region is not None
        return self.region.base - self.shared_tokens

    @property
    def prefix(self) -> tuple[int, int]:
        """(arena token, tokens) of the shared prefix it attends; (0, 0): none."""
        return (self.shared.base, self.shared_tokens) if self.shared is not None else (0, 0)

    @property
    def rank(self) -> tuple[int, float, float]:
        """Admission's order, most important highest: priority, then the nearer deadline, then age."""
        return (int(self.priority), -self.deadline, -self.arrived)

    def timings(self, now: float) -> GenerateTimings:
        """What the final message reports; `now` stands in for the join of a sequence that never joined."""
        wait = self.admission_wait_s
        first = self.first_token_at
        return GenerateTimings(
            queue_wait_s=wait + (self.scheduled or now) - self.arrived,
            time_to_first_token_s=wait + first - self.arrived if first else 0.0,
            decode_s=self.last_token_at - first if first else 0.0,
            tokens=self.generated,
            first_step=self.first_step,
            batch_size=self.first_batch,
        )

    def released(self) -> None:
        """Tells the sequence's owner (admission) its KV region is given up; once."""
        if self.on_release is not None:
            release, self.on_release = self.on_release, None
            release()

    def usage(self) -> Usage:
        return Usage(
            prompt_tokens=len(self.prompt), completion_tokens=self.generated, cached_tokens=self.cached_tokens
        )
