"""StepAttention: one step's attention over the slot cache, planned once per step (run per layer by the
scripted layer stack, llama_graph.py).

Each prefill chunk attends its own slot's cache prefix (causal, offset by the chunk's start). Decoding
rows attend in groups of similar length, each group over a view of the slot range it occupies, so one long
sequence does not make every short one attend as far as it does, and no keys or values are gathered.
Query heads that share a key/value head are folded into the query axis, so no head is repeated either.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from server.runtimes.base import Prefill

# What one more attention call costs, in (slot, key) pairs attended: about 15 us against 0.04 us per pair
# of a 6-head, 64-dim model on one CPU thread. Rows whose lengths differ by more than this are split.
_CALL_COST = 512


@dataclass(frozen=True, slots=True)
class Heads:
    heads: int
    kv_heads: int
    head_dim: int
    window: int | None  # Mistral's sliding window: a key more than this far back is not attended

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads


@dataclass(frozen=True, slots=True)
class _Chunk:
    offset: int  # first flat token of the chunk
    n: int
    slot: int
    end: int  # keys attended: the slot's first `end` positions
    mask: torch.Tensor  # [group * n, end]


@dataclass(frozen=True, slots=True)
class _Rows:
    lo: int
    hi: int  # the slot range [lo, hi) read as a view
    span: int  # keys attended
    members: torch.Tensor  # these decoding rows (indices into the step's decode rows)
    rows: torch.Tensor  # ... and their index within the range
    mask: torch.Tensor  # [hi - lo, 1, 1, span]
    direct: bool  # the group is every decoding row, the range exactly, in step order


class StepAttention:
    def __init__(self, heads: Heads, device: torch.device) -> None:
        self.heads, self.device = heads, device
        self.chunks: list[_Chunk] = []
        self.groups: list[_Rows] = []
        self.decode_offset = 0
        self.decoding = 0
        self.ends: list[int] = []  # flat index of each completing chunk's last token

    @classmethod
    def plan(
        cls, heads: Heads, device: torch.device, prefills: Sequence[Prefill], slots: Sequence[int],
        positions: Sequence[int],
    ) -> StepAttention:  # fmt: skip
        self = cls(heads, device)
        offset = 0
        for p in prefills:
            n, end = len(p.token_ids), p.start + len(p.token_ids)
            allowed = self._allowed(torch.arange(p.start, end, device=device), end)
            # Query heads of one key/value head are folded into the query axis: g * n + i.
            self.chunks.append(_Chunk(offset, n, p.slot, end, allowed.repeat(heads.group, 1)))
            if p.last:
                self.ends.append(offset + n - 1)
            offset += n
        self.decode_offset, self.decoding = offset, len(slots)
        for members in _groups(slots, positions):
            self.groups.append(
                self._rows([slots[i] for i in members], [positions[i] for i in members], members)
            )
        return self

    def _allowed(self, query_positions: torch.Tensor, keys: int) -> torch.Tensor:
        key = torch.arange(keys, device=self.device)[None, :]
        allowed = key <= query_positions[:, None]
        if self.heads.window is not None:
            allowed &= key > query_positions[:, None] - self.heads.window
        return allowed

    def _rows(self, slots: list[int], positions: list[int], members: list[int]) -> _Rows:
        device = self.device
        lo, hi, span = min(slots), max(slots) + 1, max(positions) + 1
        rows = torch.tensor(slots, dtype=torch.long, device=device) - lo
        # Rows of the range that do not decode here (paused, prefilling, in another group) see key 0 only:
        # their output is discarded, and a row with no key at all would be NaN.
        mask = torch.zeros(hi - lo, span, dtype=torch.bool, device=device)
        mask[:, 0] = True
        mask[rows] = self._allowed(torch.tensor(positions, device=device), span)
        index = torch.tensor(members, dtype=torch.long, device=device)
        return _Rows(lo, hi, span, index, rows, mask[:, None, None, :], direct=False)

    def graph_args(self) -> tuple[Any, ...]:
        """The plan as the scripted layer stack (llama_graph.py) takes it: plain lists of ints and tensors."""
        chunks = [[c.offset, c.n, c.slot, c.end] for c in self.chunks]
        groups = [[g.lo, g.hi, g.span, int(g.direct)] for g in self.groups]
        return (
            chunks, [c.mask for c in self.chunks], self.decode_offset, groups,
            [g.members for g in self.groups], [g.rows for g in self.groups], [g.mask for g in self.groups],
        )  # fmt: skip

    def last_rows(self) -> torch.Tensor:
        """Flat indices whose logits the step returns: completing chunks' last tokens, then decode rows."""
        rows = self.ends + list(range(self.decode_offset, self.decode_offset + self.decoding))
        return torch.tensor(rows, dtype=torch.long, device=self.device)


def _groups(slots: Sequence[int], positions: Sequence[int]) -> list[list[int]]:
    """Decoding rows (indices) in groups of similar length: sorted by position, a row joins the group
    before it unless attending together costs more than a separate call would."""
    order = sorted(range(len(slots)), key=lambda i: positions[i])
    groups: list[list[int]] = []
    bounds: list[tuple[int, int, int]] = []  # (lo, hi, span) per group
    for i in order:
        lo, hi, span = slots[i], slots[i] + 1, positions[i] + 1
        if groups:
            g_lo, g_hi, g_span = bounds[-1]
            merged = (max(g_hi, hi) - min(g_lo, lo)) * max(g_span, span)
            if merged <= (g_hi - g_lo) * g_span + span + _CALL_COST:
                groups[-1].append(i)
                bounds[-1] = (min(g_lo, lo), max(g_hi, hi), max(g_span, span))
                continue
        groups.append([i])
        bounds.append((lo, hi, span))
    return [sorted(g) for g in groups]  # in step order: one group's output then needs no reordering
