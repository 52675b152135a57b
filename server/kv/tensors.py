"""KvTensors: the keys and values of every region, [layers, kv_heads, tokens, head_dim] each, with the moves
the scheduler asks for (compaction, and copying a cached prefix into a new sequence's region).

On CPU the arena is anonymous mapped memory, which the kernel hands out zero-filled and only as it is
written: a large arena costs resident memory by the tokens sequences have used, not by its size.
"""

from __future__ import annotations

import mmap

import torch


class KvTensors:
    def __init__(
        self, layers: int, kv_heads: int, head_dim: int, *, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.dtype, self.device = dtype, device
        self.k = torch.empty(0, device=device)
        self.v = torch.empty(0, device=device)
        self._mapped: mmap.mmap | None = None

    def bytes_per_token(self) -> int:
        size = torch.empty(0, dtype=self.dtype).element_size()
        return 2 * self.layers * self.kv_heads * self.head_dim * size

    def allocate(self, tokens: int) -> int:
        dims = (2, self.layers, self.kv_heads, tokens, self.head_dim)
        if self.device.type == "cpu":
            size = torch.empty(0, dtype=self.dtype).element_size()
            self._mapped = mmap.mmap(
                -1, max(2 * self.layers * self.kv_heads * tokens * self.head_dim * size, 1)
            )
            both = torch.frombuffer(self._mapped, dtype=self.dtype).view(dims)
        else:
            both = torch.zeros(dims, dtype=self.dtype, device=self.device)
        self.k, self.v = both[0], both[1]
        return 2 * self.k.numel() * self.k.element_size()

    def prefault(self) -> None:
        """Writes every page of a lazily mapped (CPU) arena, so all of it is resident now."""
        if self.device.type == "cpu":
            self.k.zero_()
            self.v.zero_()

    def copy(self, moves: list[tuple[int, int, int]]) -> None:
        """(source, destination, tokens) in order; an overlapping move goes through a temporary."""
        for source, destination, n in moves:
            if n <= 0 or source == destination:
                continue
            for cache in (self.k, self.v):
                block = cache[:, :, source : source + n]
                if abs(source - destination) < n:
                    block = block.clone()
                cache[:, :, destination : destination + n] = block
