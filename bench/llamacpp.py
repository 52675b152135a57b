"""The llama.cpp server a CPU user would start on a GGUF file (`python -m llama_cpp.server`, from
`llama-cpp-python[server]` in .venv-llamacpp, which `make bench-llamacpp` builds from PyPI source), as a
benchmark child on a loopback port, and the OpenAI-style completions load the benchmarks send it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from bench.generate import Run
from bench.processes import REPO_ROOT, ChildProcess

VENV = REPO_ROOT / ".venv-llamacpp"


def llamacpp_python() -> Path | None:
    """The interpreter that has llama_cpp.server, or None where `make bench-llamacpp` has not run."""
    python = VENV / "bin" / "python"
    return (
        python if (python.exists() and any(VENV.glob("lib/python*/site-packages/llama_cpp/server"))) else None
    )


class LlamaCppServer:
    """`python -m llama_cpp.server --model FILE` with `threads` threads for decode and prompt alike, one
    sequence at a time (llama-cpp-python's server takes its requests in turn), reaped on exit."""

    def __init__(self, python: Path, model: Path, threads: int, context: int = 2048) -> None:
        args = [str(python), "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1"]
        args += ["--port", "0", "--n_threads", str(threads), "--n_threads_batch", str(threads)]
        args += ["--n_ctx", str(context), "--verbose", "False"]
        self._args = args
        self.url = ""

    def __enter__(self) -> LlamaCppServer:
        self._child = ChildProcess("llama.cpp server", self._args)
        try:
            found = self._child.wait_for(r"Uvicorn running on (http://[\d.]+:\d+)", timeout_s=120)
        except BaseException:
            self._child.stop()
            raise
        self.url = found.group(1)
        return self

    def __exit__(self, *exc: object) -> None:
        self._child.stop()

    async def completions(self, prompt: str, streams: int, tokens: int, banned: list[int]) -> Run:
        """`streams` completions at once, each `tokens` long (greedy; `banned` tokens, the model's ends,
        biased away so that every stream writes them all); tokens counted from each answer's usage."""
        body = {
            "prompt": prompt, "max_tokens": tokens, "temperature": 0.0,
            "logit_bias": {str(t): -100.0 for t in banned},
        }  # fmt: skip
        run = Run(tokens=0, wall_s=0.0)
        async with httpx.AsyncClient(base_url=self.url, timeout=3600) as client:

            async def one() -> None:
                response = await client.post("/v1/completions", json=body)
                response.raise_for_status()
                run.tokens += int(response.json()["usage"]["completion_tokens"])

            started = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(streams)))
            run.wall_s = time.perf_counter() - started
        return run
