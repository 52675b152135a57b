"""bench.fleet's load and its bookkeeping: multi-turn chat sessions through the official `openai` SDK that
resend their conversation each turn (each call named by an `X-Request-Id` of its session and turn), the
replica that served each call (from the replicas' access-log lines, which carry that id)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import openai

from wire.metadata import REQUEST_ID

_TEXT = (
    "sluice gate weir lock canal river flow level basin dam spill channel water boat keel pier tide lever "
)
_WORDS = _TEXT.split()


@dataclass(frozen=True, slots=True)
class Turn:
    session: int
    turn: int
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int
    request_id: str = ""


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(count))


async def run_sessions(
    url: str,
    *,
    sessions: int,
    turns: int,
    seed: int,
    model: str = "byte-lm",
    opening_words: int = 60,
    turn_words: int = 6,
    max_tokens: int = 8,
    tag: str = "fleet",
    start_gap_s: float = 0.0,
    think_s: float = 0.0,
) -> list[Turn]:
    """`sessions` conversations, each `turns` turns long: a system message of `opening_words` words (its
    own), then a short user turn after each answer; every turn resends the whole conversation. Each call's
    X-Request-Id is `{tag}-{seed}-{session}-{turn}`. Session i opens `start_gap_s` x i after the first
    (conversations arrive over time, as a fleet sees them; 0: all at once); a user reads an answer and types
    for 0.5 to 1.5 x `think_s` (uniform, seeded) before the next turn (0: a closed loop, which saturates
    any fleet)."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=600)
    done: list[Turn] = []

    async def session(index: int) -> None:
        await asyncio.sleep(index * start_gap_s)
        rng = random.Random(seed * 100_003 + index)
        pauses = random.Random(-(seed * 100_003 + index))  # apart: the words do not depend on the pauses
        messages: list[Any] = [
            {"role": "system", "content": f"session {seed}-{index}: " + _words(rng, opening_words)},
        ]
        for turn in range(turns):
            if turn:  # people read and type at their own pace: sessions that began together drift apart
                await asyncio.sleep(think_s * pauses.uniform(0.5, 1.5))
            messages.append({"role": "user", "content": _words(rng, turn_words)})
            request_id = f"{tag}-{seed}-{index}-{turn}"
            started = time.perf_counter()
            first: float | None = None
            parts: list[str] = []
            usage = None
            stream = await client.chat.completions.create(
                model=model, messages=messages, max_tokens=max_tokens, seed=index,
                stream=True, stream_options={"include_usage": True},
                extra_headers={REQUEST_ID: request_id},
            )  # fmt: skip
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    first = first or time.perf_counter()
                    parts.append(chunk.choices[0].delta.content)
                if chunk.usage is not None:
                    usage = chunk.usage
            assert usage is not None, "the stream ended without usage"
            details = usage.prompt_tokens_details
            cached = (details.cached_tokens or 0) if details is not None else 0
            ttft = (first or time.perf_counter()) - started
            done.append(Turn(index, turn, ttft, usage.prompt_tokens, cached, request_id))
            messages.append({"role": "assistant", "content": "".join(parts)})

    try:
        await asyncio.gather(*(session(i) for i in range(sessions)))
    finally:
        await client.close()
    return done


def cached_share(turns: Sequence[Turn]) -> float:
    """The fleet's cached-token share: usage cached_tokens over prompt tokens, all calls together."""
    return sum(t.cached_tokens for t in turns) / max(1, sum(t.prompt_tokens for t in turns))


@dataclass(frozen=True, slots=True)
class ShareLoss:
    """Where a phase's cached-token share went, as fractions of all its prompt tokens: `first` the
    conversations' first turns (uncached by nature); `tail` the part of each later turn its previous call
    could not have cached (the new messages, and what the server's 16-token blocks leave of the previous
    prompt); `moved` the rest of turns that went to another replica than their previous turn; `lost` the
    rest of turns that followed their previous turn (evicted, or a previous call still running)."""

    cached: float
    first: float
    tail: float
    moved: float
    lost: float
    followed: float  # of the later turns, the fraction served where their previous turn was

    def format(self) -> str:
        return (
            f"cached {self.cached:.3f} + first turns {self.first:.3f} + tails {self.tail:.3f} + moved "
            f"{self.moved:.3f} + lost where followed {self.lost:.3f}; followed {self.followed:.2f}"
        )


def share_loss(turns: Sequence[Turn], replica: Sequence[int], *, block: int = 16) -> ShareLoss:
    """The share's breakdown (ShareLoss) for these turns and the replica that served each."""
    by_turn = {(t.session, t.turn): (t, r) for t, r in zip(turns, replica, strict=True)}
    prompt = max(1, sum(t.prompt_tokens for t in turns))
    cached = first = tail = moved = lost = 0
    later = followed = 0
    for t, r in by_turn.values():
        cached += t.cached_tokens
        previous = by_turn.get((t.session, t.turn - 1))
        if previous is None:
            first += t.prompt_tokens - t.cached_tokens
            continue
        later += 1
        reachable = min(t.prompt_tokens, previous[0].prompt_tokens // block * block)
        tail += t.prompt_tokens - max(reachable, t.cached_tokens)
        missed = max(0, reachable - t.cached_tokens)
        if previous[1] == r:
            followed += 1
            lost += missed
        else:
            moved += missed
    return ShareLoss(
        cached / prompt,
        first / prompt,
        tail / prompt,
        moved / prompt,
        lost / prompt,
        followed / max(1, later),
    )


def served_by(logs: Sequence[Iterable[str]], turns: Sequence[Turn]) -> list[int]:
    """For each turn, the index of the replica whose access log (`--access-log 1`) names its request id."""
    where: dict[str, int] = {}
    for replica, lines in enumerate(logs):
        for line in lines:
            if '"request_id"' not in line or not line.startswith("{"):
                continue
            with_id = json.loads(line).get("request_id")
            if with_id:  # the OpenAI family's ids carry the caller's X-Request-Id after `chatcmpl-`
                where[with_id.removeprefix("chatcmpl-")] = replica
    missing = [t.request_id for t in turns if t.request_id not in where]
    if missing:
        raise LookupError(f"{len(missing)} calls in no replica's access log, e.g. {missing[:3]}")
    return [where[t.request_id] for t in turns]
