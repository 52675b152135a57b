"""A test's own reference computation on one torch thread."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Runs the block on one intra-op thread. The reference models the tests run in their own process are
    small and run beside servers and another test worker on the 2-core runner: there torch's threads spin
    waiting on each other (SmolLM2 in bfloat16, 32 greedy tokens: 52 s on two threads, under 3 s on one;
    the byte LM, 60 tokens: 9 s against 0.2 s). One thread also leaves the server its core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
