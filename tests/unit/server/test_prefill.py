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
from server.domain import Priority, SamplingParams
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


def test_joiners_that_waited_for_one_prompt_join_together_once_it_is_in() -> None:
    # A burst of one 43-token prompt (a chat template's system prompt and a question): the cache will hold
    # its first 32 tokens, so the rest wait for the first; once it is in, they find those 32 tokens and all
    # join in the next step (before: each waited for the one admitted before it, one joiner a step).
    pool = KvMemory(64 * 1024, prefix_cache=True, metrics=Metrics(), model="m", sharing=True)
    prompt = list(range(1, 44))
    queue = deque(
        GenSequence(
            prompt, SamplingParams(max_tokens=4), 0, TokenStream(4, lambda: None), TextAssembler(()), 0.0,
            feed=list(prompt),
        )
        for _ in range(8)
    )  # fmt: skip
    work = plan([], queue, pool, 32, decoding=False)
    assert len(work.joined) == 1 and len(queue) == 7
    for seq in work.commit():
        pool.prefilled(seq)
    first = work.joined
    work = plan([], queue, pool, 32, decoding=True, going_in=first)
    assert len(work.joined) == 7 and not queue
    assert [(p.start, len(p.token_ids)) for p in work.prefills()] == [(32, 11)] * 7


def test_no_joiner_takes_memory_a_growing_peer_was_just_preempted_for() -> None:
    # Issue 37: where a growing sequence preempted one of priority NORMAL this step, a NORMAL joiner
    # would take the memory so freed and be preempted back by the next growth (the churn vLLM avoids
    # by admitting nothing in a step that preempted); a HIGH one still joins, and both do a step later.
    pool = memory(8, 4096)
    normal, high = waiting(5), waiting(7)
    high[0].priority = Priority.HIGH
    queue = deque([*high, *normal])
    work = plan([], queue, pool, 32, decoding=True, yielded=int(Priority.NORMAL))
    assert work.joined == list(high) and list(queue) == list(normal)
    work = plan([], queue, pool, 32, decoding=True)
    assert work.joined == list(normal) and not queue
    queue = waiting(5)
    assert not plan([], queue, pool, None, decoding=True, yielded=int(Priority.NORMAL)).joined
