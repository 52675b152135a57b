"""bench/thread_cpu.py: a thread's CPU time is read from /proc under the name it is given (py-spy's Python
name where known, the kernel's otherwise), so a busy thread shows as itself."""

from __future__ import annotations

import os
import threading
import time

from bench.thread_cpu import thread_cpu_s


def test_a_busy_thread_is_charged_under_its_given_name() -> None:
    started, go, spun, stop = threading.Event(), threading.Event(), threading.Event(), threading.Event()
    native: list[int] = []

    def spin() -> None:
        native.append(threading.get_native_id())
        started.set()
        go.wait(30)  # spins only once the first reading is taken
        end = time.thread_time() + 0.3  # its own CPU time, however busy the machine is
        while time.thread_time() < end:
            pass
        spun.set()
        stop.wait(30)

    thread = threading.Thread(target=spin, name="spinner")
    thread.start()
    try:
        assert started.wait(10)
        names = {native[0]: "spinner", threading.get_native_id(): "MainThread"}
        before = thread_cpu_s(os.getpid(), names)
        go.set()
        assert spun.wait(60)
        after = thread_cpu_s(os.getpid(), names)
    finally:
        go.set()
        stop.set()
        thread.join(30)
    assert after["spinner"] - before["spinner"] >= 0.2
    assert after["MainThread"] - before["MainThread"] < 0.2  # the main thread only waited


def test_pool_threads_share_one_name() -> None:
    names = {threading.get_native_id(): "asyncio_3"}
    assert "asyncio_N" in thread_cpu_s(os.getpid(), names)
