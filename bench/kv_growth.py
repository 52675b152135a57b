"""bench.kv_cache's `growth` part (issue 37, acceptance 4): outputs held as written against reserved up
front, on SmolLM2 (bfloat16) with a chat mix: 96 distinct questions of twelve kinds (explain, list, write
a story, compare, give steps, ...) on eight topics, sent at once as ChatML chats with no max_tokens (the
context's remainder) and no ignore_eos, sampled (temperature 0.7, top_p 0.9, a seed each, as a chat
product runs), so each answer ends at EOS or at the context's end. Count-based, the server's scheduler
in-process (bench/kv_inprocess.py) in a fixed KV budget:

- held as written (today's server: the feed plus a 32-token look-ahead, grown as written; sharing on):
  sequences running at once, the median over the scheduler's steps when others waited for memory;
- what the tokens actually written would fit, at those steps: the budget over the running sequences' mean
  written tokens (a shared prefix once), so the ratio is the budget's fraction holding written tokens
  (target >= 0.9: the look-ahead, alignment and memory no waiting sequence fits in cost under 10%);
- up-front reservation as before issue 37 (max_tokens = the context's remainder reserved on joining, so
  each holds the context; sharing off): sequences running at once (target: held as written >= 3x);
- answers longer than 128 tokens (the old default max_tokens) and whether any was cut before EOS or the
  context's end.

    .venv/bin/python -m bench.kv_cache --part growth [--repeats N] [--quick]
"""

from __future__ import annotations

import statistics

from bench import kv_inprocess, kv_models
from bench.generate import spread
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


def growth(repeats: int, quick: bool, cpu: str) -> None:
    chats, context, budget = (40, 1024, 6144) if quick else (len(QUESTIONS), 2048, 16384)
    target = kv_models.smollm2()
    model = target.load(context, chats)

    def specs(repeat: int) -> list[GenerateSpec]:
        return [
            GenerateSpec(
                model=target.name,
                prompt_text=None,
                prompt_ids=None,
                prompt_chat=(ChatTurn("user", q),),
                sampling=Sampling(temperature=0.7, top_p=0.9, seed=1000 * repeat + i),
            )
            for i, q in enumerate(QUESTIONS[:chats])
        ]

    grown, upfront = [], []
    for repeat in range(repeats):
        grown.append(kv_inprocess.run(model, specs(repeat), kv_tokens=budget, sharing=True))
        upfront.append(
            kv_inprocess.run(
                model, specs(repeat), kv_tokens=budget, sharing=False, upfront=True, stop_at_first_finish=True
            )
        )
    running = [h.bound_median for h in grown]
    used = [statistics.median(h.used(budget)) for h in grown]  # running / what their tokens would fit
    fit = [r / u for r, u in zip(running, used, strict=True)]
    before = [float(h.at_first_finish) for h in upfront]
    peaks = [float(h.peak) for h in grown]
    lengths = [n for h in grown for n in h.lengths]
    outputs = [len(out) for h in grown for out in h.outputs.values()]
    print(
        f"\ngrowth (SmolLM2-135M-Instruct, bfloat16; {cpu}): {chats} chats at once, no max_tokens, no "
        f"ignore_eos, context {context}, a KV budget of {budget:,} tokens"
    )
    print(
        f"  running at once while others waited for memory (median over those steps), held as written "
        f"against what the tokens they had written would fit (budget / their mean written tokens, the same "
        f"steps): {spread(running, digits=1)} against {spread(fit, digits=1)} = {spread(used, digits=2)} "
        f"(target >= 0.9) [{cpu}]"
    )
    print(
        f"  running at once, held as written against up-front reservation (max_tokens = the context's "
        f"remainder, sharing off): {spread(running, digits=1)} (peak {spread(peaks)}, "
        f"{spread([h.preemptions for h in grown])} preemptions) against {spread(before)} = "
        f"{statistics.median(running) / statistics.median(before):.1f}x (target >= 3x) [{cpu}]"
    )
    ended = sum(n < context for n in lengths)
    print(
        f"  answers: {len(outputs)} over {len(grown)} repeat(s), output tokens median "
        f"{statistics.median(outputs):.0f}, mean {statistics.mean(outputs):.0f}, max {max(outputs)}; longer "
        f"than 128 tokens: {sum(n > 128 for n in outputs)}; ended before the context's end (EOS): {ended} of "
        f"{len(lengths)}"
    )
