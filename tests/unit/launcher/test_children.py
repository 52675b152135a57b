"""Child: lines are waited for by pattern (after the last match, or from the oldest kept), the tail is
bounded, a child that exits or stays silent fails the wait with its last lines, and stop() reaps it."""

from __future__ import annotations

import signal
import sys

import psutil
import pytest

from launcher.children import Child, ChildFailed


def python(code: str, **options: object) -> Child:
    return Child("t", [sys.executable, "-c", code], **options)  # type: ignore[arg-type]


def test_waits_consume_lines_and_a_rescan_sees_earlier_ones() -> None:
    with python("import sys\nfor i in range(3): print('line', i)\nsys.stdin.read()", stdin=True) as child:
        assert child.wait_for(r"line (\d)", 10).group(1) == "0"
        assert child.wait_for(r"line (\d)", 10).group(1) == "1"
        assert child.wait_for(r"line 0", 10, rescan=True).group(0) == "line 0"
        assert child.wait_for(r"line (\d)", 10).group(1) == "2"


def test_an_exit_or_silence_fails_the_wait_with_the_last_lines() -> None:
    with (
        python("print('about to go')") as child,
        pytest.raises(ChildFailed, match=r"(?s)exited with 0.*about to go"),
    ):
        child.wait_for(r"never", 10)
    with (
        python("import time; print('quiet'); time.sleep(30)") as child,
        pytest.raises(ChildFailed, match="within 0 s"),
    ):
        child.wait_for(r"never", 0.2)


def test_the_kept_lines_are_bounded_and_relayed() -> None:
    relayed: list[str] = []
    with python("for i in range(500): print(i)", history=10, relay=relayed.append) as child:
        child.proc.wait(10)
        child.wait_for(r"^499$", 10)
        assert list(child.lines) == [str(i) for i in range(490, 500)]
    assert len(relayed) == 500


def test_stop_terminates_then_reaps_and_sigint_is_not_inherited_as_ignored() -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        child = python("import time; print('up', flush=True); time.sleep(60)", die_with_parent=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    child.wait_for("up", 10)
    child.signal(signal.SIGINT)  # the child set SIGINT back to its default: it stops
    assert child.proc.wait(10) != 0
    assert child.stop(5) == child.proc.returncode


def test_a_child_started_to_die_with_its_parent_does_when_the_parent_is_killed() -> None:
    # A parent that starts a sleeping child and prints its pid; SIGKILL gives the parent no chance to
    # stop it: the kernel's death signal, asked for by the trampoline before exec, does.
    parent_code = (
        "import sys; from launcher.children import Child; "
        "c = Child('c', [sys.executable, '-c', 'import time; time.sleep(120)'], die_with_parent=True); "
        "print('child', c.pid, flush=True); import time; time.sleep(120)"
    )
    parent = python(parent_code)
    pid = int(parent.wait_for(r"child (\d+)", 30).group(1))
    child = psutil.Process(pid)
    assert "time.sleep(120)" in " ".join(child.cmdline())  # the program itself, exec'd in place
    try:
        parent.signal(signal.SIGKILL)
        child.wait(10)  # not our child (its exit status goes to init): that it ended is what counts
    finally:
        parent.stop(5)
        if child.is_running():
            child.kill()


def test_a_program_that_is_not_there_fails_in_the_parent() -> None:
    with pytest.raises(FileNotFoundError):
        Child("t", ["no-such-program-anywhere"])
