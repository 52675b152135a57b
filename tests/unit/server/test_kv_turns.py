"""Issue 37, item 4, with the real scheduler and byte LM: a conversation's next turn references the previous
turn's blocks while they are cached (its own region holds only the new user turn and its answer), also
where the previous turn was itself a sharer (of a cached system prompt) and so was cached as a whole copy;
read from the KV gauges as Prometheus serves them. Greedy output is the same with sharing off, where each
turn copies the conversation into its own region."""

from __future__ import annotations

from server.batching.continuous import ContinuousScheduler
from server.batching.memory import LOOKAHEAD, KvMemory
from server.batching.sequence import GenSequence
from server.domain import GenerateSpec
from server.kv.arena import ALIGN, aligned
from tests.support.scheduler import run_scheduler
from wire.sampling import Sampling

SYSTEM = [97 + (7 * i) % 26 for i in range(320)]  # 20 blocks
USER = [list(f" question {turn}: and then what happened?".encode()) for turn in range(3)]
ANSWER = 40


def ask(scheduler: ContinuousScheduler, ids: list[int], tokens: int) -> GenSequence:
    sampling = Sampling(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    return scheduler.submit(
        GenerateSpec(model="byte-lm", prompt_text=None, prompt_ids=tuple(ids), sampling=sampling)
    )


Peak = tuple[float, float, int]  # reserved and shared gauges, the turn's tokens attended in place


def conversation(sharing: bool) -> tuple[list[list[int]], list[int], list[Peak]]:
    """An earlier caller's request caches the system prompt; then three turns, each resending the
    conversation so far and a new question. Returns the answers, each turn's prompt length and, per turn,
    the highest reserved and shared gauges while it ran and the tokens it attended in place."""
    answers: list[list[int]] = []
    prompts: list[int] = []
    peaks: list[Peak] = []

    async def body(scheduler: ContinuousScheduler) -> None:
        publish, gauges = scheduler.gauges.sequences, scheduler.gauges._kv
        seen: list[Peak] = []

        def record(active: int, runnable: int, memory: KvMemory) -> None:  # at every iteration
            publish(active, runnable, memory)
            referenced = max((s.shared_tokens for s in scheduler.active), default=0)
            seen.append((gauges[2]._value.get(), gauges[5]._value.get(), referenced))

        scheduler.gauges.sequences = record  # type: ignore[method-assign]
        earlier = ask(scheduler, [*SYSTEM, 1, 2, 3], 8)
        [_ async for _ in scheduler.chunks(earlier)]
        history = list(SYSTEM)
        for turn in range(3):
            history += USER[turn]
            seen.clear()
            seq = ask(scheduler, history, ANSWER)
            answer = [t async for chunk in scheduler.chunks(seq) for t in chunk.token_ids]
            answers.append(answer)
            prompts.append(len(history))
            peaks.append((max(p[0] for p in seen), max(p[1] for p in seen), max(p[2] for p in seen)))
            history += answer

    run_scheduler(
        body, kv_tokens=8192, context=1024, max_sequences=8, timeout_s=300, prefix_sharing=sharing,
        prefill_chunk_tokens=32, stall_timeout_s=60.0,
    )  # fmt: skip
    return answers, prompts, peaks


def test_a_next_turn_references_the_previous_turns_cached_blocks() -> None:
    answers, prompts, peaks = conversation(True)
    # Turn 0 references the cached system prompt (20 blocks of the earlier request's region: the gauge
    # counts that region once, whole); its own region holds its question and answer.
    reserved, shared, referenced = peaks[0]
    assert referenced == len(SYSTEM) and shared == aligned(len(SYSTEM) + 3 + 8 - 1)
    assert reserved <= prompts[0] - referenced + ANSWER + LOOKAHEAD + ALIGN
    for turn in (1, 2):
        # The previous turn (a sharer itself) was cached whole: this turn attends its prompt and its
        # answer where they lie (every full block), and holds only the rest and its answer as its own.
        written = prompts[turn - 1] + ANSWER - 1  # the last token of an answer is sent, never attended
        reserved, shared, referenced = peaks[turn]
        assert referenced == written // ALIGN * ALIGN and shared == aligned(written), (turn, peaks[turn])
        assert reserved <= prompts[turn] - referenced + ANSWER + LOOKAHEAD + ALIGN, (turn, reserved)
        assert reserved < prompts[turn] - len(SYSTEM)  # not a copy of the conversation
    copied, prompts_off, peaks_off = conversation(False)
    assert copied == answers and prompts_off == prompts
    for turn in (1, 2):
        reserved, shared, referenced = peaks_off[turn]
        assert shared == referenced == 0 and reserved >= prompts[turn]  # sharing off: each copies it all
