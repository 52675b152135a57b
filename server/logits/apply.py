"""One step's logits processing for the rows that need it, batched: grammar masks computed by llguidance
on a thread of their own while the forward pass runs (it drops the GIL), then repetition, frequency and
presence penalties and logit_bias over the penalised rows at once, then the masks. Rows with no state pay
nothing."""

from __future__ import annotations

import concurrent.futures
import threading

import llguidance
import numpy as np
import torch

from server.logits.state import RowState

Rows = list[tuple[int, RowState, int]]  # (row of the step, its state, tokens the sequence will have)

_local = threading.local()
_pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sluice-masks")


def _executor() -> llguidance.LLExecutor:
    executor = getattr(_local, "executor", None)
    if executor is None:
        executor = _local.executor = llguidance.LLExecutor(num_threads=1)
    return executor


def _masks(states: list[RowState], vocab_size: int, eos_id: int) -> np.ndarray:
    """Each grammar row's additive mask [rows, vocab] (0 allowed, -inf not), on the masks thread: the
    matchers first take the tokens sampled since the last step."""
    for state in states:
        state.advance()
    words = (vocab_size + 31) // 32
    out = np.zeros((len(states), words), dtype=np.int32)
    live = [(s.matcher, i) for i, s in enumerate(states) if s.matcher is not None and not s.ended]
    if live:
        _executor().unsafe_compute_mask_ptr(live, out.ctypes.data, words * 4, len(states))
    for i, state in enumerate(states):
        state.check()  # a failure while taking the tokens or computing the mask: the step reports it
        if state.ended:  # nothing more may follow: EOS only (the row's token is discarded anyway)
            out[i, eos_id // 32] = np.int32(np.uint32(1 << (eos_id % 32)).view(np.int32))
    bits = np.unpackbits(out.view(np.uint8), axis=1, bitorder="little")[:, :vocab_size]
    return np.where(bits, np.float32(0), np.float32(-np.inf))


def start(rows: Rows, vocab_size: int, eos_id: int | None) -> concurrent.futures.Future[np.ndarray] | None:
    """Brings every state to its row's count and starts the grammar rows' masks; call before the forward."""
    for _, state, generated in rows:
        state.sync(generated)
    grammar = [state for _, state, _ in rows if state.matcher is not None]
    if not grammar or eos_id is None:
        return None
    return _pool.submit(_masks, grammar, vocab_size, eos_id)


def process(logits: torch.Tensor, rows: Rows, masks: concurrent.futures.Future[np.ndarray] | None) -> None:
    """Penalties, bias and masks on logits [N, V] in place (float32 rows)."""
    penalised = [(row, state) for row, state, _ in rows if state.penalised]
    if penalised:
        index = torch.tensor([row for row, _ in penalised], device=logits.device)
        counts = torch.stack([state.counts for _, state in penalised if state.counts is not None])
        values = logits[index].float()
        repetition = torch.tensor([s.repetition for _, s in penalised], device=logits.device)[:, None]
        if bool((repetition != 1).any()):
            seen = counts > 0
            prompt = [s.prompt_seen for _, s in penalised]
            if any(p is not None for p in prompt):
                seen |= torch.stack([p if p is not None else torch.zeros_like(seen[0]) for p in prompt])
            scaled = torch.where(values > 0, values / repetition, values * repetition)
            values = torch.where(seen, scaled, values)
        frequency = torch.tensor([s.frequency for _, s in penalised], device=logits.device)[:, None]
        presence = torch.tensor([s.presence for _, s in penalised], device=logits.device)[:, None]
        values = values - frequency * counts - presence * (counts > 0)
        logits[index] = values.to(logits.dtype)
    for row, state, _ in rows:
        if state.bias_ids is not None and state.bias_values is not None:
            logits[row].index_add_(0, state.bias_ids, state.bias_values.to(logits.dtype))
    if masks is not None:
        grammar = [row for row, state, _ in rows if state.matcher is not None]
        bias = torch.from_numpy(masks.result()).to(logits.device, logits.dtype, non_blocking=True)
        width = min(bias.shape[-1], logits.shape[-1])
        if len(grammar) == len(logits) and width == logits.shape[-1]:
            logits += bias  # every row constrained: no gather
        else:
            index = torch.tensor(grammar, device=logits.device)
            logits[index, :width] += bias[:, :width]


def failures(rows: Rows) -> dict[int, str]:
    """The rows whose matcher has failed, with its error (call once the masks are in: `process`)."""
    return {row: state.failure for row, state, _ in rows if state.failure is not None}


def accept(rows: Rows, tokens: list[int]) -> None:
    """Each row's sampled token into its state (the counts grow; the matcher takes it with the next
    step's masks)."""
    for row, state, _ in rows:
        state.accept(tokens[row])
