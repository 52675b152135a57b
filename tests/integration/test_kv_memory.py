"""Issue 19, acceptance 1: KV memory by the token. Greedy output equals transformers' generate token for
token for seeded Llama, Mistral (sliding window), Qwen2 (the native decoder) and GPT-2 (the generic path)
with the prefix cache on and off, and with preemption forced (a KV budget that holds half the streams,
HIGH calls arriving while LOW streams hold it); a seeded sampled stream is the same preempted or not;
the cached prompt tokens are reported in the usage. Issue 37, item 3: streams that outgrow the memory as
they write preempt each other (the youngest yields) with every output still generate's, and a request
without max_tokens runs to the context's end."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from clients import SluiceClient
from tests.support.hf_models import greedy_reference, save
from tests.support.packages import require
from tests.support.processes import ServerProcess, start_server, wait_until

require("transformers")

KINDS = ("llama", "mistral", "qwen2", "gpt2")
SHARED = "You are a careful assistant. Answer briefly. "  # 45 bytes: two cache blocks and a bit
# 128 KiB: 256 tokens of the Llama-family test models (512 bytes each), 128 of GPT-2's (1 KiB each). A
# LOW stream takes 128 (its prompt and 100 tokens, aligned), so two run at once (GPT-2: one), long enough
# for the HIGH calls to find them running however loaded the machine; a HIGH call takes 64, so the four
# need the whole budget and preempt every LOW stream.
BUDGET = ["--kv-cache-bytes", str(128 * 1024), "--context-length", "128", "--default-max-tokens", "64"]
LOW = [f"low stream {i}" for i in range(4)]
LOW_TOKENS = 100
HIGH = [f"HIGH {i}: hurry" for i in range(4)]


@pytest.fixture(scope="module")
def directories(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {kind: save(kind, tmp_path_factory.mktemp(kind)) for kind in KINDS}


def serve(directories: dict[str, Path], *flags: str) -> ServerProcess:
    models = ",".join(f"{kind}={path}" for kind, path in directories.items())
    return start_server("--hf-models", models, "--prefill-chunk-tokens", "8", *flags)


@pytest.fixture(scope="module", params=["true", "false"], ids=["prefix cache", "no prefix cache"])
def server(
    request: pytest.FixtureRequest, directories: dict[str, Path]
) -> Iterator[tuple[ServerProcess, bool]]:
    process = serve(directories, "--context-length", "256", "--prefix-cache", request.param)
    yield process, request.param == "true"
    assert process.terminate() == 0


@pytest.fixture(scope="module")
def tight(directories: dict[str, Path]) -> Iterator[ServerProcess]:
    process = serve(directories, *BUDGET)
    yield process
    assert process.terminate() == 0


def generate(server: ServerProcess, model: str, prompt: str, **kw: object) -> tuple[list[int], int]:
    """The tokens and the cached prompt tokens of one stream."""
    with SluiceClient(server.target) as client:
        chunks = list(client.generate(model, prompt, ignore_eos=True, **kw))  # type: ignore[arg-type]
    usage = chunks[-1].usage
    assert usage is not None
    return [t for c in chunks for t in c.token_ids], usage.cached_tokens


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_output_is_generates_with_shared_prefixes(
    server: tuple[ServerProcess, bool], directories: dict[str, Path], kind: str
) -> None:
    process, prefix_on = server
    prompts = [SHARED + "first question", SHARED + "second one", SHARED + "first question, again"]
    cached = []
    for prompt in prompts:  # one after another: each finds what the one before left
        got, hit = generate(process, kind, prompt, max_tokens=20, temperature=0.0)
        assert got == greedy_reference(directories[kind], list(prompt.encode()), 20), (kind, prompt)
        cached.append(hit)
    assert cached[0] == 0
    assert all(hit >= 32 for hit in cached[1:]) if prefix_on else cached == [0, 0, 0], cached


def run_all(server: ServerProcess, model: str, prompts: list[str], **kw: object) -> dict[str, list[int]]:
    results: dict[str, list[int]] = {}
    errors: list[BaseException] = []

    def run(prompt: str) -> None:
        try:
            results[prompt] = generate(server, model, prompt, **kw)[0]
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(p,)) for p in prompts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    return results


@pytest.mark.parametrize("kind", KINDS)
def test_high_calls_preempt_low_streams_and_every_output_is_generates(
    tight: ServerProcess, directories: dict[str, Path], kind: str
) -> None:
    before = tight.metric("sluice_preemptions_total", model=kind) or 0
    low: dict[str, list[int]] = {}
    low_thread = threading.Thread(
        target=lambda: low.update(
            run_all(tight, kind, LOW, max_tokens=LOW_TOKENS, temperature=0.0, priority="low")
        )
    )
    low_thread.start()
    wait_until(
        lambda: (tight.metric("sluice_kv_slots_in_use", model=kind) or 0) >= (1 if kind == "gpt2" else 2),
        what="the LOW streams hold the memory",
    )
    high = run_all(tight, kind, HIGH, max_tokens=40, temperature=0.0, priority="high")
    low_thread.join(timeout=120)
    assert (tight.metric("sluice_preemptions_total", model=kind) or 0) > before
    for prompt, got in {**low, **high}.items():
        tokens = LOW_TOKENS if prompt in low else 40
        assert got == greedy_reference(directories[kind], list(prompt.encode()), tokens), (kind, prompt)


def test_a_seeded_sampled_stream_is_the_same_preempted_or_not(tight: ServerProcess) -> None:
    sampled = {"max_tokens": LOW_TOKENS, "seed": 11, "temperature": 0.9, "top_p": 0.95}
    alone = generate(tight, "llama", "seeded low", priority="low", **sampled)[0]
    preempted: list[list[int]] = []
    thread = threading.Thread(
        target=lambda: preempted.append(generate(tight, "llama", "seeded low", priority="low", **sampled)[0])
    )
    before = tight.metric("sluice_preemptions_total", model="llama") or 0
    thread.start()
    fill = threading.Thread(
        target=lambda: run_all(tight, "llama", LOW[:3], max_tokens=LOW_TOKENS, priority="low")
    )
    fill.start()
    wait_until(lambda: (tight.metric("sluice_kv_slots_in_use", model="llama") or 0) >= 2, what="memory full")
    run_all(tight, "llama", HIGH, max_tokens=40, priority="high")
    thread.join(timeout=120)
    fill.join(timeout=120)
    assert (tight.metric("sluice_preemptions_total", model="llama") or 0) > before
    assert preempted == [alone] and len(alone) == LOW_TOKENS


def test_without_max_tokens_a_stream_runs_past_128_tokens_to_the_context(
    server: tuple[ServerProcess, bool], directories: dict[str, Path]
) -> None:
    process, _ = server
    prompt = "tell me a long story"
    got, _ = generate(process, "llama", prompt, temperature=0.0)  # no max_tokens: the context's remainder
    assert len(got) == 256 - len(prompt) > 128
    assert got == greedy_reference(directories["llama"], list(prompt.encode()), len(got))


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_streams_outgrowing_the_memory_preempt_each_other_and_every_output_is_generates(
    tight: ServerProcess, directories: dict[str, Path], kind: str
) -> None:
    # Four equal streams of 12 + 100 tokens: each joins holding 48, and the 256 tokens hold two whole.
    before = tight.metric("sluice_preemptions_total", model=kind) or 0
    got = run_all(tight, kind, LOW, max_tokens=LOW_TOKENS, temperature=0.0)
    assert (tight.metric("sluice_preemptions_total", model=kind) or 0) > before
    for prompt, tokens in got.items():
        expected = greedy_reference(directories[kind], list(prompt.encode()), LOW_TOKENS)
        assert tokens == expected, (kind, prompt)
