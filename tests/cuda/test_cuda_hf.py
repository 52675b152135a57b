"""Issue 10, point 5: the native Llama-family decoder on CUDA, on the same code path as on CPU. Greedy
output equals transformers' generate (float32, so that rounding matches), bfloat16 is the default dtype,
the KV cache is sized from measured free device memory, and a real OOM in a step ends that step's streams
and trips the breaker while the server keeps serving. Run by scripts/cuda_check.sh (CI has no GPU)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
import torch

from clients import SluiceClient
from server.batching.continuous import ContinuousScheduler
from server.batching.requests import RequestLimits
from server.batching.worker import ModelWorker
from server.config import Settings
from server.domain import FinishReason, GenerateSpec
from server.memory.capacity import kv_tokens
from server.memory.probes import CudaProbe
from server.metrics import Metrics
from server.runtimes.hf_causal import load_hf_causal
from tests.support.hf_models import greedy_reference, save
from tests.support.processes import start_server
from wire.sampling import Sampling

pytestmark = pytest.mark.cuda
GPU = torch.device("cuda")


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save("llama", tmp_path_factory.mktemp("cuda-llama"))


def test_greedy_output_on_the_gpu_equals_generate(llama: Path) -> None:
    server = start_server("--device", "cuda", "--dtype", "float32", "--hf-models", f"llama={llama}")
    prompts = {"a": 30, "The quick brown fox jumps": 20, "x" * 37: 25}
    results: dict[str, list[int]] = {}
    try:

        def run(prompt: str, n: int) -> None:
            with SluiceClient(server.target) as client:
                chunks = client.generate("llama", prompt, max_tokens=n, temperature=0.0, ignore_eos=True)
                results[prompt] = [t for c in chunks for t in c.token_ids]

        threads = [threading.Thread(target=run, args=item) for item in prompts.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        with SluiceClient(server.target) as client:
            described = client.get_model("llama")
    finally:
        assert server.terminate() == 0
    assert described.device.startswith("cuda") and "native decoder" in described.description
    for prompt, n in prompts.items():
        assert results[prompt] == greedy_reference(llama, list(prompt.encode()), n), prompt
    print(f"\nCUDA greedy: {len(prompts)} concurrent streams equal transformers' generate")


def test_bfloat16_is_the_default_on_cuda(llama: Path) -> None:
    server = start_server("--device", "cuda", "--hf-models", f"llama={llama}")
    try:
        with SluiceClient(server.target) as client:
            described = client.get_model("llama")
            chunks = list(client.generate("llama", "bf16", max_tokens=24, ignore_eos=True, seed=3))
    finally:
        assert server.terminate() == 0
    assert "bfloat16" in described.description
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 24


def test_the_kv_cache_is_sized_from_free_device_memory(llama: Path) -> None:
    model = load_hf_causal(
        llama, name="llama", context_length=256, max_sequences=64, device=GPU, dtype=torch.bfloat16
    )
    per_token = model.kv_bytes_per_token()
    used = CudaProbe(GPU).read().used_bytes
    # A budget with room for 10,000 tokens at the default fraction: free memory decides (no CPU cap).
    probe = CudaProbe(GPU, budget_bytes=used + int(10_000.5 * per_token / Settings().kv_cache_memory))
    tokens, why = kv_tokens(model, Settings(), 256, probe.read())
    print(f"\nCUDA KV sizing: {tokens} tokens ({why})")
    assert abs(tokens - 10_000) <= 1 and "x free" in why


def test_an_oom_in_a_step_ends_its_streams_and_trips_the_breaker(llama: Path) -> None:
    from server.memory.breaker import MemoryBreaker

    model = load_hf_causal(
        llama, name="llama", context_length=256, max_sequences=4, device=GPU, dtype=torch.bfloat16
    )
    worker = ModelWorker("cuda-hf-oom")
    worker.call(model.allocate_cache, 4 * 256)
    real_forward = model.forward
    failures = [1]

    def hungry(*args: object) -> torch.Tensor:
        if failures:
            failures.pop()
            # A real allocation the device cannot hold, inside the step.
            torch.empty(torch.cuda.get_device_properties(GPU).total_memory * 2, dtype=torch.uint8, device=GPU)
        return real_forward(*args)  # type: ignore[arg-type]

    model.forward = hungry  # type: ignore[method-assign, assignment]
    breaker = MemoryBreaker(CudaProbe(GPU), high=0.99, low=0.98, interval_s=1)

    async def main() -> tuple[FinishReason | None, str, bool, int]:
        limits = RequestLimits(context_length=256, default_max_tokens=8)
        scheduler = ContinuousScheduler(
            model, worker, kv_tokens=4 * 256, limits=limits, stream_buffer=16, stall_timeout_s=30,
            breaker=breaker, metrics=Metrics(), prefill_chunk_tokens=512,
        )  # fmt: skip
        task = asyncio.create_task(scheduler.run())
        spec = GenerateSpec(
            model="llama",
            prompt_text="oom",
            prompt_ids=None,
            sampling=Sampling(max_tokens=8, ignore_eos=True),
        )
        failed = [c async for c in scheduler.chunks(scheduler.submit(spec))]
        tripped = breaker.is_open
        later = [c async for c in scheduler.chunks(scheduler.submit(spec))]
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        error = failed[-1].error
        return (
            failed[-1].finish_reason,
            error.code if error else "",
            tripped,
            sum(len(c.token_ids) for c in later),
        )

    started = time.monotonic()
    reason, code, tripped, served_after = asyncio.run(main())
    worker.shutdown()
    took = time.monotonic() - started
    print(
        f"\nCUDA HF OOM: {reason} {code}, breaker tripped={tripped}; "
        f"the next stream {served_after} tokens ({took:.1f} s)"
    )
    assert (reason, code, tripped) == (FinishReason.ERROR, "RESOURCE_EXHAUSTED", True)
    assert served_after == 8


def test_prefix_cache_and_preemption_on_the_gpu_equal_generate(llama: Path) -> None:
    """Issue 19 on CUDA: the arena's copies (a cached prefix), strided views and recomputation after a
    preemption give transformers' greedy output, as on CPU (tests/integration/test_kv_memory.py)."""
    budget = 2 * 64 * 512  # the test Llama's 512 bytes per token x 128 tokens: two 64-token streams
    server = start_server(
        "--device", "cuda", "--dtype", "float32", "--hf-models", f"llama={llama}",
        "--kv-cache-bytes", str(budget), "--context-length", "128", "--default-max-tokens", "64",
    )  # fmt: skip
    shared = "A shared system prompt, long enough for two blocks. "
    results: dict[str, list[int]] = {}
    try:

        def run(prompt: str, priority: str) -> None:
            with SluiceClient(server.target) as client:
                chunks = client.generate(
                    "llama",
                    prompt,
                    max_tokens=12,
                    temperature=0.0,
                    ignore_eos=True,
                    priority=priority,  # type: ignore[arg-type]
                )
                results[prompt] = [t for c in chunks for t in c.token_ids]

        run(shared + "first", "normal")
        low = [threading.Thread(target=run, args=(shared + f"low {i}", "low")) for i in range(2)]
        for thread in low:
            thread.start()
        run(shared + "high", "high")
        for thread in low:
            thread.join(timeout=120)
        preempted = server.metric("sluice_preemptions_total", model="llama")
        hits = server.metric("sluice_prefix_cache_hits_total", model="llama")
    finally:
        assert server.terminate() == 0
    for prompt, got in results.items():
        assert got == greedy_reference(llama, list(prompt.encode()), 12), prompt
    assert hits >= 1
    print(
        f"\nCUDA KV arena: {len(results)} streams equal generate; {hits:.0f} prefix hits, "
        f"{preempted:.0f} preempted"
    )


def test_constrained_streams_and_penalties_on_the_gpu(llama: Path) -> None:
    """Issue 20: grammar masks, penalties and logit_bias on CUDA logits (the masks are built on the host and
    added on the device): every sample of a schema validates, a +100 bias forces its token, and greedy with
    repetition_penalty equals transformers' generate with the same penalty."""
    import json
    import re

    from wire.constraint import Constraint

    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["n"], "additionalProperties": False}  # fmt: skip
    server = start_server("--device", "cuda", "--dtype", "float32", "--hf-models", f"llama={llama}")
    prompt = [5, 9, 12, 5, 9]
    try:
        with SluiceClient(server.target) as client:

            def text(prompt: object, **kw: object) -> str:
                return "".join(c.text for c in client.generate("llama", prompt, **kw))  # type: ignore[arg-type]

            def tokens(prompt: object, **kw: object) -> list[int]:
                return [t for c in client.generate("llama", prompt, **kw) for t in c.token_ids]  # type: ignore[arg-type]

            shaped = Constraint.json_schema(json.dumps(schema))
            texts = [text("x", constraint=shaped, seed=seed, max_tokens=40) for seed in range(20)]
            regex = text("x", constraint=Constraint.regex("[a-f]{5}"), seed=1, max_tokens=10)
            forced = tokens("x", temperature=0, max_tokens=3, logit_bias={66: 100})
            penalised = tokens(prompt, temperature=0, max_tokens=12, ignore_eos=True, repetition_penalty=1.8)
    finally:
        assert server.terminate() == 0
    assert all(0 <= json.loads(t)["n"] <= 99 for t in texts) and re.fullmatch("[a-f]{5}", regex)
    assert forced == [66, 66, 66]
    assert penalised == greedy_reference(llama, prompt, 12, repetition_penalty=1.8)
    print("\nCUDA constraints: 20 schema samples valid, regex, logit_bias and repetition_penalty as generate")
