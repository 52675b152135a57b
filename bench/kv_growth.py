"""bench.kv_cache's `growth` part (issue 37, acceptance 4): outputs held as written against reserved up
front, on SmolLM2 (bfloat16) at the context Sluice serves it with by default (--context-length 0: the
model's own, 8,192, its GGUF's max_position_embeddings), with a chat mix: 96 distinct questions of twelve
kinds (explain, list, write a story, compare, give steps, ...) on eight topics, cycled to CHATS chats
(a seed each) sent at once as ChatML chats with no max_tokens (the context's remainder) and no ignore_eos,
sampled (temperature 0.7, top_p 0.9, as a chat product runs), so each answer ends at EOS or at the
context's end. Count-based, the server's scheduler in-process (bench/kv_inprocess.py) in a KV budget of
CONTEXTS contexts (2: up-front reservation runs 2 sequences, held as written dozens; --quick: 1):

- held as written (today's server: the feed plus a 32-token look-ahead, grown as written; sharing on):
  sequences running at once, the median over the scheduler's steps when others waited for memory (from
  the first preemption on), until the burst's memory-bound wave is over (STOP_AFTER steps in a row with
  none waiting) or WINDOW such steps have run, where the run stops: answers that never reach EOS would
  otherwise run on, a step each, to the context's 8,192 tokens);
- what the tokens actually written would fit, at those steps: the budget over the running sequences' mean
  written tokens (a shared prefix once; a feed's chunks count once computed, not only once the whole
  feed is in: their keys and values are in the cache), so the ratio is the budget's fraction holding
  written tokens (target >= 0.9: the look-ahead, alignment and memory no waiting sequence fits in cost
  under 10%);
- up-front reservation as before issue 37 (max_tokens = the context's remainder reserved on joining, so
  each holds the context; sharing off): sequences running at once when the first answer ends, run in the
  same scheduler (target: held as written >= 3x);
- where the budget went at the memory-bound steps: written tokens (of them, chunks of feeds still going
  in), the rest of the regions of feeds still going in (rejoiners being recomputed), look-ahead (and
  alignment), and free or evictable (cached prefixes);
- the answers finished by the stop, those longer than 128 tokens (the old default max_tokens), and the
  ones still writing at the stop.

    .venv/bin/python -m bench.kv_cache --part growth [--repeats N] [--quick]
"""

from __future__ import annotations

import statistics
import time

from bench import kv_inprocess, kv_models
from bench.generate import spread
from bench.kv_inprocess import Held
from server.domain import ChatTurn, GenerateSpec
from wire.sampling import Sampling

KINDS = (
    "Explain {} to a ten-year-old.",
    "List five surprising facts about {}.",
    "Write a short story in which {} plays a part.",
    "What are the pros and cons of {}?",
    "Give me step-by-step instructions to get started with {}.",
    "Write a haiku about {}.",
    "Compare {} with something from everyday life.",
    "What is the history of {}, in a few sentences?",
    "Answer in one word: is {} useful?",
    "Write an email inviting a friend to learn about {} with me.",
    "What common mistakes do beginners make with {}?",
    "Summarise the most important idea behind {}.",
)
TOPICS = (
    "photosynthesis", "the Roman empire", "machine learning", "bread baking", "black holes",
    "the stock market", "learning the guitar", "recycling plastic",
)  # fmt: skip
QUESTIONS = [kind.format(topic) for topic in TOPICS for kind in KINDS]  # 96, every kind on every topic


#: Chats offered at once, the KV budget in contexts, and the memory-bound steps measured at most: (full,
#: --quick). A burst must ask for more than the budget at its peak or it never waits for memory (64 chats
#: in 2 contexts peaked at ~10k written tokens); the window bounds the run's time: answers that never
#: reach EOS go on alone to the context.
CHATS, CONTEXTS, WINDOW = (160, 96), (2, 1), (384, 256)
#: Steps in a row with no sequence waiting for memory that end the measured wave (one look-ahead's worth:
#: every running sequence has grown once since the last one waited).
STOP_AFTER = 32


def growth(repeats: int, quick: bool, cpu: str, chats: int = 0, contexts: int = 0) -> None:
    """`chats`, `contexts`: 0, as CHATS and CONTEXTS say."""
    chats, contexts = chats or CHATS[quick], contexts or CONTEXTS[quick]
    target = kv_models.smollm2()
    model = target.load(0, chats)  # 0: Sluice's default context for it, the model's own
    context = model.descriptor.limits.context_length
    budget = contexts * context

    def specs(repeat: int) -> list[GenerateSpec]:
        return [
            GenerateSpec(
                model=target.name,
                prompt_text=None,
                prompt_ids=None,
                prompt_chat=(ChatTurn("user", QUESTIONS[i % len(QUESTIONS)]),),
                sampling=Sampling(temperature=0.7, top_p=0.9, seed=1000 * repeat + i),
            )
            for i in range(chats)
        ]

    grown, upfront, wall = [], [], []
    for repeat in range(repeats):
        started = time.perf_counter()
        grown.append(
            kv_inprocess.run(
                model,
                specs(repeat),
                kv_tokens=budget,
                sharing=True,
                stop_after_bound=STOP_AFTER,
                max_bound_steps=WINDOW[quick],
            )
        )
        wall.append(time.perf_counter() - started)
        upfront.append(
            kv_inprocess.run(
                model, specs(repeat), kv_tokens=budget, sharing=False, upfront=True, stop_at_first_finish=True
            )
        )
    print(
        f"\ngrowth (SmolLM2-135M-Instruct, bfloat16; {cpu}): {chats} chats at once, no max_tokens, no "
        f"ignore_eos, context {context:,} (Sluice's default for it: the model's own), a KV budget of "
        f"{budget:,} tokens ({contexts} x the context); held as written ran {spread(wall, digits=0)} s "
        "a repeat"
    )
    _report(grown, upfront, budget, context, cpu)


def _report(grown: list[Held], upfront: list[Held], budget: int, context: int, cpu: str) -> None:
    running = [h.bound_median for h in grown]
    used = [statistics.median(h.used(budget)) for h in grown]  # running / what their tokens would fit
    fit = [r / u for r, u in zip(running, used, strict=True)]
    before = [float(h.at_first_finish) for h in upfront]
    steps = [float(len(h.bound)) for h in grown]
    print(
        f"  running at once while others waited for memory (median over those steps: {spread(steps)} of "
        f"them), held as written against what the tokens they had written would fit (budget / their mean "
        f"written tokens, the same steps): {spread(running, digits=1)} against {spread(fit, digits=1)} = "
        f"{spread(used, digits=2)} (target >= 0.9) [{cpu}]"
    )
    print(
        f"  running at once, held as written against up-front reservation (max_tokens = the context's "
        f"remainder, each joiner holding {context:,}; sharing off): {spread(running, digits=1)} (peak "
        f"{spread([float(h.peak) for h in grown])}, {spread([h.preemptions for h in grown])} preemptions, "
        f"{spread([h.compactions for h in grown])} compactions) "
        f"against {spread(before)} = {statistics.median(running) / statistics.median(before):.1f}x "
        f"(target >= 3x) [{cpu}]"
    )
    parts = {
        "written": [h.at_bound(h.written, budget) for h in grown],
        "of it feeds' chunks in": [h.at_bound(h.chunks_in, budget) for h in grown],
        "feeds going in": [h.at_bound(h.prefilling, budget) for h in grown],
        "look-ahead": [
            h.at_bound([a - w - p for a, w, p in zip(h.held, h.written, h.prefilling, strict=True)], budget)
            for h in grown
        ],
        "free or cached": [h.at_bound([budget - a for a in h.held], budget) for h in grown],
    }
    shares = ", ".join(
        f"{name} {spread([statistics.mean(f or [0.0]) for f in per], digits=3)}"
        for name, per in parts.items()
    )
    print(f"  the budget at those steps (mean fraction): {shares}")
    done = [len(h.outputs[i]) for h in grown for i in h.finished]
    writing = [len(out) for h in grown for i, out in h.outputs.items() if i not in h.finished]
    ended = sum(n < context for h in grown for n in h.lengths)
    print(
        f"  answers finished by the stop: {len(done)} of {sum(len(h.outputs) for h in grown)} over "
        f"{len(grown)} repeat(s), output tokens median {statistics.median(done):.0f}, mean "
        f"{statistics.mean(done):.0f}, max {max(done)}; longer than 128 tokens: {sum(n > 128 for n in done)};"
        " "
        f"ended at EOS (before the context's end): {ended} of {sum(len(h.lengths) for h in grown)}; still "
        f"writing at the stop: {len(writing)}"
        + (
            f", output tokens so far median {statistics.median(writing):.0f}, max {max(writing)}"
            if writing
            else ""
        )
    )
