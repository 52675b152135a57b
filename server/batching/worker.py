"""ModelWorker: the one thread a model's torch code runs on, so the event loop never blocks on torch."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

import torch

P = ParamSpec("P")
T = TypeVar("T")


class ModelWorker:
    """One thread per model: torch already uses every core per op, so more threads only contend."""

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"model-{name}")

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(_inference, fn, *args, **kwargs))

    def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Runs fn on the worker thread and waits (start-up only: loading, warm-up, measurement)."""
        return self._executor.submit(functools.partial(_inference, fn, *args, **kwargs)).result()

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)


def _inference(fn: Callable[..., T], *args: object, **kwargs: object) -> T:
    with torch.inference_mode():
        return fn(*args, **kwargs)
