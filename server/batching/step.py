"""One iteration's model work, run on the model's worker thread: the prefill chunks and one decode step for
the running sequences (one pass where the runtime fuses them), then one sampled token for every row whose
prompt is complete, in one batched call."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from server.batching.extras import RequestExtras
from server.batching.oom import release_cached_memory
from server.batching.sampling import greedy_tokens, sample, uniforms
from server.batching.sequence import GenSequence
from server.domain import SamplingParams
from server.logits.apply import Rows, accept, failures
from server.logits.apply import process as process_logits
from server.logits.apply import start as start_masks
from server.runtimes.base import GenerativeModel, Prefill
from server.runtimes.step_batch import StepBatch

_NO_DRAWS = np.zeros(0, dtype=np.float64)


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What the worker needs, copied out of the sequences on the event loop (the worker touches none)."""

    moves: list[tuple[int, int, int]]  # KV copies before the forward pass (compaction, cached prefixes)
    compactions: list[tuple[int, int]]  # [start, end) of `moves` for each compaction: timed apart
    prefills: list[Prefill]
    bases: list[int]
    last_tokens: list[int]
    prev_rows: list[int]  # per decode row: the previous step's output row that is its input, or -1
    positions: list[int]
    params: list[SamplingParams]
    uniforms: np.ndarray
    eos_masked: list[int]  # rows whose sequence may not end yet (min_tokens): EOS cannot be sampled there
    logprob_rows: list[tuple[int, int]]  # (row, alternatives) for the rows that asked for log-probabilities
    processed: Rows  # rows with a grammar, penalties or logit_bias (server/logits), and their counts
    greedy: bool = False  # every row at temperature 0: the token is the argmax, no sampling tensors
    prefill_extras: list[RequestExtras] = field(default_factory=list)  # per prefill: its request's extras
    decode_extras: list[RequestExtras] = field(default_factory=list)  # per running row: its request's extras
    prefixes: list[tuple[int, int]] = field(default_factory=list)  # per running row: its shared prefix

    @classmethod
    def of(
        cls,
        moves: list[tuple[int, int, int]],
        prefills: list[Prefill],
        completing: list[GenSequence],
        runnable: list[GenSequence],
        *,
        generated: list[int],
        positions: list[int],
        prev_rows: list[int],
        compactions: list[tuple[int, int]] | None = None,
        prefill_extras: list[RequestExtras] | None = None,
    ) -> StepPlan:
        """Rows: the sequences whose feed this step completes (their next token), then the running ones.
        `generated` (per row), `positions` and `prev_rows` (per running row) are what the sequences will
        have once the step in flight is in (lookahead.py)."""
        batch = completing + runnable
        params = [s.params for s in batch]
        greedy = all(p.temperature <= 0 for p in params)
        if greedy:  # no draw is made: the event loop skips the uniforms' array work
            draws = _NO_DRAWS
        else:
            seeds = np.fromiter((s.seed for s in batch), dtype=np.uint64, count=len(batch))
            draws = uniforms(seeds, np.asarray(generated, dtype=np.int64))
        return cls(
            moves=moves,
            compactions=compactions or [],
            prefills=prefills,
            bases=[s.base for s in runnable],
            last_tokens=[s.last_token for s in runnable],
            prev_rows=prev_rows,
            positions=positions,
            params=params,
            uniforms=draws,
            eos_masked=[
                row
                for row, s in enumerate(batch)
                if generated[row] < s.params.min_tokens and (s.logits is None or s.logits.matcher is None)
            ],
            logprob_rows=[
                (row, s.params.logprobs) for row, s in enumerate(batch) if s.params.logprobs is not None
            ],
            processed=[
                (row, s.logits, generated[row]) for row, s in enumerate(batch) if s.logits is not None
            ],
            greedy=greedy,
            prefill_extras=prefill_extras or [],
            decode_extras=[s.extras for s in runnable],
            prefixes=[s.prefix for s in runnable],
        )


class StepChain:
    """The model thread's memory of the last step's sampled tokens, which the next step's rows take as
    input without a trip through the event loop."""

    def __init__(self, flush: Callable[[], None] = lambda: None) -> None:
        self.tokens: torch.Tensor | None = None
        self.flush = flush  # the worker's: the previous step's result may go to the loop now


@dataclass(slots=True)
class StepResult:
    """One token per row (the joiners' first tokens, then the running sequences' next ones), and for the
    rows that asked, (chosen token's logprob, [(alternative id, logprob), ...] most likely first); the rows
    whose grammar matcher has failed, with its error (their token is only the EOS the mask left)."""

    tokens: list[int]
    logprobs: dict[int, tuple[float, list[tuple[int, float]]]]
    failures: dict[int, str] = field(default_factory=dict)
    started: float = 0.0  # perf_counter on the model's thread: the step's compute, and the gap before it
    finished: float = 0.0
    compactions: list[float] = field(default_factory=list)  # seconds each compaction's copies took


def run_step(model: GenerativeModel, plan: StepPlan, chain: StepChain) -> StepResult:
    """One iteration's model work, on the model's thread."""
    started = time.perf_counter()
    try:
        compactions = _move(model, plan) if plan.moves else []
        result = _step(model, plan, chain)
        result.started, result.finished, result.compactions = started, time.perf_counter(), compactions
        return result
    except torch.OutOfMemoryError:
        chain.tokens = None
        release_cached_memory()  # here, on the model's thread; the scheduler counts it and trips the breaker
        raise
    except Exception:
        chain.tokens = None  # the next step's rows that wanted this one's tokens are discarded anyway
        raise


# Where the model thread's step calls torch from Python, an op releases the GIL and takes it back after,
# waiting while the event loop holds it (up to the switch interval): the fast paths below save such calls
# in the common step (every row decoding on from the step before; all greedy). `bench.step_gil` times a
# batch-8 Llama step on the fast and the general path, alone and beside a thread that holds the GIL.


def _inputs(plan: StepPlan, chain: StepChain, device: torch.device) -> torch.Tensor:
    previous, prev_rows = chain.tokens, plan.prev_rows
    if previous is not None and len(previous) == len(prev_rows) and prev_rows == list(range(len(prev_rows))):
        return previous  # every row's input is the same row's output of the step before
    tokens = torch.tensor(plan.last_tokens, dtype=torch.long, device=device)
    if previous is not None and any(row >= 0 for row in prev_rows):
        rows = torch.tensor(prev_rows, dtype=torch.long, device=device)
        tokens = torch.where(rows >= 0, previous[rows.clamp(min=0)], tokens)
    return tokens


def _move(model: GenerativeModel, plan: StepPlan) -> list[float]:
    """Applies the step's KV moves in order; returns how long each compaction's copies took. Compaction is
    rare and copies whole regions, so the device is synchronised around it: the time is the copies', not
    the launches' (an asynchronous device would hide it in the forward pass after)."""
    moves, seconds, at = plan.moves, [], 0
    for start, end in plan.compactions:
        if at < start:
            model.move_kv(moves[at:start])
        _synchronise(model.device)
        began = time.perf_counter()
        model.move_kv(moves[start:end])
        _synchronise(model.device)
        seconds.append(time.perf_counter() - began)
        at = end
    if at < len(moves):
        model.move_kv(moves[at:])
    return seconds


def _synchronise(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _step(model: GenerativeModel, plan: StepPlan, chain: StepChain) -> StepResult:
    device = model.device
    if not plan.prefills and not plan.bases:
        chain.tokens = None
        return StepResult([], {})  # a step of moves only
    inputs = _inputs(plan, chain, device)
    positions = torch.tensor(plan.positions, dtype=torch.long, device=device)
    masks = start_masks(plan.processed, model.vocab_size, model.eos_id) if plan.processed else None
    # The previous step's result goes to the loop where this step's long torch call begins, not before its
    # Python: the loop's delivery then holds the GIL while this thread needs none (h2load on a bench Llama,
    # two servers side by side: +11% tokens/s at 8 streams, +7% at 32).
    batch = StepBatch(
        plan.prefills, plan.bases, inputs, positions, plan.prefill_extras, plan.decode_extras, plan.prefixes
    )
    logits = model.step(batch, computing=chain.flush)
    if not len(logits):
        chain.tokens = None
        return StepResult([], {})  # only chunks of prompts that do not end yet
    # Log-probabilities of the model's own distribution: before min_tokens' mask and temperature.
    logprobs = (
        torch.log_softmax(logits[[r for r, _ in plan.logprob_rows]].float(), dim=-1)
        if plan.logprob_rows
        else None
    )
    if plan.processed:
        process_logits(logits, plan.processed, masks)
    if plan.eos_masked and model.eos_id is not None:
        logits[plan.eos_masked, model.eos_id] = -torch.inf
    if plan.greedy:
        chosen = greedy_tokens(logits)  # as sample() does for an all-greedy batch, without its tensors
    else:
        chosen = sample(
            logits,
            temperature=torch.tensor([p.temperature for p in plan.params], device=device),
            top_k=torch.tensor([p.top_k for p in plan.params], device=device),
            top_p=torch.tensor([p.top_p for p in plan.params], device=device),
            u=torch.from_numpy(plan.uniforms).to(device),
        )
    chain.tokens = chosen
    tokens = [int(t) for t in chosen.tolist()]
    if plan.processed:
        accept(plan.processed, tokens)
    return StepResult(
        tokens,
        _logprobs(plan, tokens, logprobs) if logprobs is not None else {},
        failures(plan.processed) if masks is not None else {},  # the masks are in: process() waited
    )


def _logprobs(
    plan: StepPlan, tokens: list[int], logprobs: torch.Tensor
) -> dict[int, tuple[float, list[tuple[int, float]]]]:
    rows = [r for r, _ in plan.logprob_rows]
    at = logprobs.device
    chosen = logprobs[
        torch.arange(len(rows), device=at), torch.tensor([tokens[r] for r in rows], device=at)
    ].tolist()
    most = max(k for _, k in plan.logprob_rows)
    values: list[list[float]] = [[] for _ in rows]
    ids: list[list[int]] = [[] for _ in rows]
    if most:
        top_values, top_ids = logprobs.topk(most, dim=-1)
        values, ids = top_values.tolist(), top_ids.tolist()
    return {
        row: (chosen[i], list(zip(ids[i][:k], values[i][:k], strict=True)))
        for i, (row, k) in enumerate(plan.logprob_rows)
    }
