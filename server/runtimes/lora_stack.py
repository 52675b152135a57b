"""A step's LoRA adapters as the native decoder's layer stack takes them (decoder_graph.LayerStack, whose
lora_graph.lora_delta adds them): the loaded adapters stacked in banks of at most STACK_RANKS ranks, each
bank's A side by side and B one above the other per fused projection (oneDNN-prepacked where the base
model's weights are), so that one x @ A_bank, masked to each row's own adapter's columns, @ B_bank adapts
every row of the bank at once (punica's BGMV, in torch: three ops per projection and layer whatever the
adapters, where grouping rows by adapter took four per adapter; bench.lora_step).

The mask costs FLOPs: every row of a bank multiplies by all its adapters' columns, the others' masked to
zero (the LoRA FLOPs are some 2% of SmolLM2's per rank 16; small bfloat16 matmuls cost ~15 us each however
small), so past STACK_RANKS the adapters go into further banks, each over its own rows (gathered). A step
whose rows name one adapter of a bank takes that adapter's own weights (no mask, no idle columns).

Banks are copies, built when the loaded adapters change (`restack`, off the step's thread) and swapped in
whole: until then a newly loaded adapter's rows, and an unloaded adapter's running ones, take its own
weights."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from server.runtimes.lora import PROJECTIONS, LoraAdapter, RowAdapter
from server.runtimes.quantized import prepacks

#: The ranks one bank holds (--max-loras 4 x --max-lora-rank 16, the defaults, fit in one): past it, a row's
#: masked columns would cost more than one more bank's gather and scatter.
STACK_RANKS = 64
#: The mask slots after a layer's (A, B) pairs: lora_graph reads projection p's mask at MASKS + p.
MASKS = 2 * len(PROJECTIONS)


@dataclass(frozen=True, slots=True)
class _Bank:
    """Adapters' weights stacked per layer as LayerStack reads them (A, B of each projection in PROJECTIONS'
    order), and per column of each projection's A the slot of the adapter it belongs to (`owners`: the
    distinct column layouts; `layout`, per layer and projection, the index of its own)."""

    slots: dict[int, int]  # adapter uid -> its slot
    layers: list[list[torch.Tensor]]
    owners: list[torch.Tensor]
    layout: list[list[int]]


class LoraStacks:
    """The banks of one model's loaded adapters, and each step's stacks."""

    def __init__(self, dtype: torch.dtype, device: torch.device) -> None:
        self.dtype, self.device = dtype, device
        self._banks: dict[int, _Bank] = {}  # adapter uid -> its bank; replaced whole by restack
        self._no_mask = torch.empty(0, dtype=dtype, device=device)

    def restack(self, adapters: Iterable[LoraAdapter]) -> None:
        """Banks of `adapters` (in load order), replacing the former ones; a bank of one adapter is none."""
        # Called on a worker thread, whose OpenMP team starts at every core, not at --torch-threads (torch
        # applies it per thread on first use): oneDNN's reorders would spin on every core beside the steps.
        torch.set_num_threads(torch.get_num_threads())
        banks: dict[int, _Bank] = {}
        for members in _packed(sorted(adapters, key=lambda a: a.uid)):
            if len(members) > 1:
                bank = _stacked(tuple(members), self.dtype, self.device)
                banks |= dict.fromkeys(bank.slots, bank)
        self._banks = banks

    def segments(
        self, chunk_sizes: Sequence[int], prefill_extras: Sequence[RowAdapter],
        decode_extras: Sequence[RowAdapter],
    ) -> tuple[list[list[list[torch.Tensor]]], list[torch.Tensor]]:  # fmt: skip
        """Per stack in the step: per layer, (A, B) of each projection then each projection's mask (rows x
        columns; empty where the stack is one adapter's), and the stack's token rows (the prefill chunks'
        tokens first, then one row per decoding sequence, ascending). Empty when no row has an adapter: the
        layer stack then runs exactly the base model's ops."""
        row_adapters: list[LoraAdapter | None] = []
        chunk_extras: Sequence[RowAdapter | None] = prefill_extras or [None] * len(chunk_sizes)
        for size, extras in zip(chunk_sizes, chunk_extras, strict=True):
            row_adapters += [extras.adapter if extras is not None else None] * size
        row_adapters += [extras.adapter for extras in decode_extras]
        banks = self._banks  # one consistent table for the step
        groups: dict[int, list[LoraAdapter]] = {}  # a bank's id (or an adapter's own uid) -> its adapters
        group_of: dict[int, int] = {}
        for adapter in row_adapters:
            if adapter is not None and adapter.uid not in group_of:
                bank = banks.get(adapter.uid)
                key = id(bank) if bank is not None else -adapter.uid
                group_of[adapter.uid] = key
                groups.setdefault(key, []).append(adapter)
        weights, rows = [], []
        for key, members in groups.items():
            picked = [i for i, a in enumerate(row_adapters) if a is not None and group_of[a.uid] == key]
            if len(members) == 1:
                layers = members[0].layers
                weights.append([layer + [self._no_mask] * len(PROJECTIONS) for layer in layers])
            else:
                bank = banks[members[0].uid]
                own = [bank.slots[a.uid] for i in picked if (a := row_adapters[i]) is not None]
                slots = torch.tensor(own, device=self.device)
                masks = [(slots[:, None] == owner[None, :]).to(self.dtype) for owner in bank.owners]
                weights.append(
                    [ab + [masks[i] for i in at] for ab, at in zip(bank.layers, bank.layout, strict=True)]
                )
            rows.append(torch.tensor(picked, dtype=torch.long, device=self.device))
        return weights, rows


def _packed(adapters: list[LoraAdapter]) -> list[list[LoraAdapter]]:
    """The adapters in banks of at most STACK_RANKS ranks (in order; one adapter alone may exceed it)."""
    banks: list[list[LoraAdapter]] = []
    ranks = 0
    for adapter in adapters:
        if not banks or ranks + adapter.rank > STACK_RANKS:
            banks.append([])
            ranks = 0
        banks[-1].append(adapter)
        ranks += adapter.rank
    return banks


def _prepacked(weight: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`weight` [in, out] as lora_graph multiplies by it: as a linear weight [out, in] in oneDNN's blocked
    layout where the base model's are (quantized.prepacks), else as it is."""
    if not prepacks(dtype, device):
        return weight
    packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(weight.t().contiguous(), 32)
    return packed


def _stacked(members: tuple[LoraAdapter, ...], dtype: torch.dtype, device: torch.device) -> _Bank:
    empty = torch.empty(0, dtype=dtype, device=device)
    layers: list[list[torch.Tensor]] = []
    owners: dict[tuple[int, ...], int] = {}
    layout: list[list[int]] = []
    for layer in range(len(members[0].layers)):
        weights: list[torch.Tensor] = []
        at: list[int] = []
        for p in range(len(PROJECTIONS)):
            parts = [(s, m.layers[layer][2 * p], m.layers[layer][2 * p + 1]) for s, m in enumerate(members)]
            parts = [part for part in parts if part[1].numel() > 0]
            if parts:
                a, b = torch.cat([a for _, a, _ in parts], dim=1), torch.cat([b for _, _, b in parts])
                weights += [_prepacked(a, dtype, device), _prepacked(b, dtype, device)]
            else:
                weights += [empty, empty]
            owner = tuple(s for s, a, _ in parts for _ in range(a.shape[1]))
            at.append(owners.setdefault(owner, len(owners)))
        layers.append(weights)
        layout.append(at)
    columns = [torch.tensor(owner, dtype=torch.long, device=device) for owner in owners]
    slots = {member.uid: s for s, member in enumerate(members)}
    return _Bank(slots, layers, columns, layout)
