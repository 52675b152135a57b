"""Which prompt tokens a step prefills (issue 10, point 2): a long prompt goes in a chunk per step, one at
a time, while streams decode; short prompts join whole; with nothing decoding a burst goes in together,
up to the step's budget; a runtime that cannot chunk gets whole prompts."""

from __future__ import annotations

from collections import deque

from server.batching.memory import KvMemory
from server.batching.prefill import STEP_CHUNKS, plan_prefill
from server.batching.sequence import GenSequence
from server.batching.stream import TokenStream
from server.batching.text import TextAssembler
from server.domain import SamplingParams
from server.metrics import Metrics


def waiting(*sizes: int) -> deque[GenSequence]:
    return deque(
        GenSequence(
            [1] * n, SamplingParams(max_tokens=4), 0, TokenStream(4, lambda: None), TextAssembler(()), 0.0,
            feed=[1] * n,
        )
        for n in sizes
    )  # fmt: skip


def memory(sequences: int, context: int) -> KvMemory:
    """Room for `sequences` sequences of `context` tokens (each here takes its prompt + 4, aligned)."""
    return KvMemory(sequences * context, prefix_cache=False, metrics=Metrics(), model="m")


def plan(*args: object, **kw: object):  # type: ignore[no-untyped-def]
    return plan_prefill(*args, preempt=lambda seq: None, **kw)  # type: ignore[arg-type]


def test_while_streams_decode_a_long_prompt_goes_in_a_chunk_per_step() -> None:
    pool, queue = memory(8, 4096), waiting(100, 5, 70)
    work = plan([], queue, pool, 32, decoding=True)
    assert [(p.start, len(p.token_ids), p.last) for p in work.prefills()] == [(0, 32, False), (0, 5, True)]
    # The second long prompt holds its region and waits for the first: no chunk of it this step.
    assert not queue and len(work.joined) == 3 and work.joined[2].planned == 0
    work.commit()
    long_one = work.joined[0]
    steps = 1
    while long_one.prefilled < 100:
        work = plan([long_one], queue, pool, 32, decoding=True)
        prefills = work.prefills()
        assert len(prefills[0].token_ids) <= 32
        work.commit()
        steps += 1
    assert (steps, long_one.position) == (4, 100)
    assert prefills[0].last and prefills[0].start == 96


def test_with_nothing_decoding_a_burst_goes_in_together_up_to_the_budget() -> None:
    pool, queue = memory(64, 4096), waiting(*[30] * 40)
    work = plan([], queue, pool, 32, decoding=False)
    assert sum(len(p.token_ids) for p in work.prefills()) == 30 * (32 * STEP_CHUNKS // 30)
    assert all(p.last for p in work.prefills())
    assert work.completing == work.joined


def test_a_runtime_that_cannot_chunk_gets_whole_prompts_while_memory_lasts() -> None:
    pool, queue = memory(1, 912 + 1008 + 16 + 8), waiting(900, 1000, 5, 7)  # aligned: 7 + 4 needs 16
    work = plan([], queue, pool, None, decoding=True)
    assert [len(p.token_ids) for p in work.prefills()] == [900, 1000, 5]
    assert len(queue) == 1 and pool.holders == 3
