"""StepAttention: one step's attention over the KV arena, planned once per step (run per layer by the
scripted attention, decoder_graph.py).

Each prefill chunk attends its own region's prefix (causal, offset by the chunk's start). Decoding rows
attend in groups: a group is rows whose regions start at equal strides (as sequences admitted together
are laid out), read as one strided view [rows, kv, span, dim] of the arena, so a batch of similar
sequences attends in one call and one long sequence does not make every short one attend as far as it
does. No keys or values are gathered or copied. Query heads that share a key/value head are folded into
the query axis, so no head is repeated either.

A sequence may attend a prefix held in another region (issue 37: a cached or running prompt referenced,
not copied): its own region then holds only the positions after it. Decoding rows that share a prefix
attend it in one call, their queries batched against its keys, and their own parts as groups of strided
views; the two are merged by their log-sum-exp (cascade attention). A prefill chunk with a prefix attends
the prefix's keys and its own, concatenated (a chunk's attention costs its tokens times the keys: the copy
is small beside it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from server.runtimes.base import Prefill

# What one more attention call costs, in (row, key) pairs attended: about 15 us against 0.04 us per pair
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
    base: int  # the region's first arena token
    end: int  # keys attended: the region's first `end` positions
    mask: torch.Tensor  # [group * n, end]
    prefix: tuple[int, int]  # (arena token, tokens) of its prefix held apart; (0, 0): none


@dataclass(frozen=True, slots=True)
class _Rows:
    lo: int  # the first row's region base
    stride: int  # tokens between the view's rows
    count: int  # rows of the view
    span: int  # keys attended
    members: torch.Tensor  # these decoding rows (indices into the step's decode rows)
    rows: torch.Tensor  # ... and their row within the view
    mask: torch.Tensor  # [count, 1, 1, span]
    direct: bool  # the group is every decoding row, the view's rows exactly, in step order
    prefix: tuple[int, int] = (0, 0)  # a cascade: every member attends these keys first (arena token, tokens)


class StepAttention:
    def __init__(self, heads: Heads, device: torch.device, tokens: int) -> None:
        self.heads, self.device, self.tokens = heads, device, tokens
        self.chunks: list[_Chunk] = []
        self.groups: list[_Rows] = []
        self.cascades: list[_Rows] = []  # groups of rows with a shared prefix: their own parts
        self.decode_offset = 0
        self.decoding = 0
        self.ends: list[int] = []  # flat index of each completing chunk's last token

    @classmethod
    def plan(
        cls, heads: Heads, device: torch.device, tokens: int, prefills: Sequence[Prefill],
        bases: Sequence[int], positions: Sequence[int], prefixes: Sequence[tuple[int, int]] = (),
    ) -> StepAttention:  # fmt: skip
        """`tokens`: the arena's size (a strided view never reads past it); `prefixes`: per decoding row, the
        (arena token, tokens) of the prefix it attends apart, (0, 0) for none (as every row without)."""
        self = cls(heads, device, tokens)
        offset = 0
        for p in prefills:
            n, end = len(p.token_ids), p.start + len(p.token_ids)
            allowed = self._allowed(torch.arange(p.start, end, device=device), end)
            # Query heads of one key/value head are folded into the query axis: g * n + i.
            prefix = (p.shared_base, p.shared)
            self.chunks.append(_Chunk(offset, n, p.base, end, allowed.repeat(heads.group, 1), prefix))
            if p.last:
                self.ends.append(offset + n - 1)
            offset += n
        self.decode_offset, self.decoding = offset, len(bases)
        plain = [i for i in range(len(bases)) if not prefixes or not prefixes[i][1]]
        for lo, stride, count, members in _groups(bases, positions, tokens, plain):
            self.groups.append(self._rows(lo, stride, count, bases, positions, members))
        by_prefix: dict[tuple[int, int], list[int]] = {}
        for i in range(len(bases)) if prefixes else ():
            if prefixes[i][1]:
                by_prefix.setdefault(prefixes[i], []).append(i)
        for prefix, rows in by_prefix.items():  # own parts: their regions from position `held` on
            held = prefix[1]
            own_bases = [bases[i] + held if i in rows else 0 for i in range(len(bases))]
            own = [positions[i] - held if i in rows else 0 for i in range(len(bases))]
            for lo, stride, count, members in _groups(own_bases, own, tokens, rows):
                self.cascades.append(self._rows(lo, stride, count, own_bases, own, members, prefix))
        return self

    def _allowed(self, query_positions: torch.Tensor, keys: int) -> torch.Tensor:
        key = torch.arange(keys, device=self.device)[None, :]
        allowed = key <= query_positions[:, None]
        if self.heads.window is not None:
            allowed &= key > query_positions[:, None] - self.heads.window
        return allowed

    def _rows(
        self, lo: int, stride: int, count: int, bases: Sequence[int], positions: Sequence[int],
        members: list[int], prefix: tuple[int, int] = (0, 0),
    ) -> _Rows:  # fmt: skip
        device = self.device
        span = max(positions[i] for i in members) + 1
        rows = torch.tensor([(bases[i] - lo) // stride for i in members], dtype=torch.long, device=device)
        if (
            len(members) == self.decoding
            and members == sorted(members)
            and count == len(members)
            and not prefix[1]
        ):
            direct = rows.tolist() == members  # every row, in step order, the view exactly
        else:
            direct = False
        # Rows of the view that do not decode here (paused, prefilling, free memory) see key 0 only: their
        # output is discarded, and a row with no key at all would be NaN.
        mask = torch.zeros(count, span, dtype=torch.bool, device=device)
        mask[:, 0] = True
        mask[rows] = self._allowed(torch.tensor([positions[i] for i in members], device=device), span)
        index = torch.tensor(members, dtype=torch.long, device=device)
        return _Rows(lo, stride, count, span, index, rows, mask[:, None, None, :], direct, prefix)

    def graph_args(self) -> tuple[Any, ...]:
        """The plan as the scripted layer stack (decoder_graph.py) takes it: lists of ints and tensors."""
        chunks = [[c.offset, c.n, c.base, c.end, *c.prefix] for c in self.chunks]
        groups = [
            [g.lo, g.stride, g.count, g.span, int(g.direct), *g.prefix] for g in self.groups + self.cascades
        ]
        every = self.groups + self.cascades
        return (
            chunks, [c.mask for c in self.chunks], self.decode_offset, groups,
            [g.members for g in every], [g.rows for g in every], [g.mask for g in every],
        )  # fmt: skip

    def last_rows(self) -> torch.Tensor:
        """Flat indices whose logits the step returns: completing chunks' last tokens, then decode rows."""
        rows = self.ends + list(range(self.decode_offset, self.decode_offset + self.decoding))
        return torch.tensor(rows, dtype=torch.long, device=self.device)


def _groups(
    bases: Sequence[int], positions: Sequence[int], tokens: int, chosen: Sequence[int] | None = None
) -> list[tuple[int, int, int, list[int]]]:
    """The `chosen` decoding rows (None: all) in groups (lo, stride, rows of the view, members): in arena
    order, a row joins the group before it where its region starts a whole number of strides on (the first
    two members set the stride) and attending together costs no more than a separate call would."""
    order = sorted(range(len(bases)) if chosen is None else chosen, key=lambda i: bases[i])
    groups: list[tuple[int, int, int, list[int]]] = []
    span = 0
    for i in order:
        base, need = bases[i], positions[i] + 1
        if groups:
            lo, stride, count, members = groups[-1]
            step = stride or base - lo
            if step > 0 and (base - lo) % step == 0:
                rows, wide = (base - lo) // step + 1, max(span, need)
                fits = lo + (rows - 1) * step + wide <= tokens
                if fits and rows * wide <= count * span + need + _CALL_COST:
                    groups[-1] = (lo, step, rows, [*members, i])
                    span = wide
                    continue
        groups.append((base, 0, 1, [i]))
        span = need
    # Step order within a group: its output then needs no reordering; a lone row's stride is immaterial.
    return [(lo, stride or 1, count, sorted(members)) for lo, stride, count, members in groups]
