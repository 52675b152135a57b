"""Issue 36, item 5: sluice_tokens_discarded_total counts each cause apart (its `reason` label), on a real
server. A short completion that ends itself (a stop token, a guided yes/no choice ending by EOS) costs the
one look-ahead token the step planned behind its last computes (server/batching/lookahead.py): counted as
`finished`, never as `cancelled`, so SluiceTokensForNobody does not blame its client; a stream the caller
cancels counts its step in flight as `cancelled`."""

from __future__ import annotations

import httpx
import torch

from bench.prometheus import total
from clients import SluiceClient
from tests.support import byte_lm_reference
from tests.support.processes import ServerProcess, ShimProcess, wait_until

MODEL = "byte-lm"
REASONS = ("cancelled", "finished", "preempted")


def discarded(server: ServerProcess) -> dict[str, float]:
    samples = server.metrics()
    counts = {r: total(samples, "sluice_tokens_discarded_total", model=MODEL, reason=r) for r in REASONS}
    counts["after_cancel"] = total(samples, "sluice_tokens_after_cancel_total", model=MODEL)
    return counts


def settle(server: ServerProcess) -> None:
    """No sequence of the model left running: every discard of the streams before is counted."""
    wait_until(lambda: server.metric("sluice_sequences_active", model=MODEL) == 0, what="no active sequences")
    wait_until(
        lambda: server.metric("sluice_requests_in_flight", method="Generate") == 0, what="no stream in flight"
    )
    wait_until(
        lambda: server.metric("sluice_kv_slots_in_use", model=MODEL) == 0, what="every region given up"
    )


def change(server: ServerProcess, before: dict[str, float]) -> dict[str, float]:
    settle(server)
    after = discarded(server)
    return {reason: after[reason] - before[reason] for reason in after}


def test_a_completion_ended_by_a_stop_token_counts_its_look_ahead_as_finished(server: ServerProcess) -> None:
    with SluiceClient(server.target) as client:
        first = client.generate(MODEL, "yes or no?", max_tokens=6, temperature=0.0)
        greedy = [t for c in first for t in c.token_ids]
        settle(server)
        before = discarded(server)
        stop = greedy[2]
        chunks = list(
            client.generate(MODEL, "yes or no?", max_tokens=64, temperature=0.0, stop_token_ids=[stop])
        )
    assert chunks[-1].finish_reason == "stop"
    produced = [t for c in chunks for t in c.token_ids]
    assert produced == greedy[: greedy.index(stop) + 1]
    # Exactly the one token of the step planned while its last one computed; nobody left.
    assert change(server, before) == {"cancelled": 0, "finished": 1, "preempted": 0, "after_cancel": 0}


def test_a_guided_yes_no_choice_counts_its_look_ahead_as_finished(
    server: ServerProcess, shim: ShimProcess
) -> None:
    settle(server)
    before = discarded(server)
    prompt = "Is the sky blue? Answer: "
    body = {
        "model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0.0, "guided_choice": ["yes", "no"],
    }  # fmt: skip
    answer = httpx.post(f"{shim.url}/v1/completions", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    # Greedy under the grammar: the first byte is the likelier of "y" and "n"; the rest is forced.
    with torch.inference_mode():
        first = byte_lm_reference.logits(byte_lm_reference.model(), list(prompt.encode()))
    expected = "yes" if first[ord("y")] > first[ord("n")] else "no"
    assert (choice["text"], choice["finish_reason"]) == (expected, "stop")
    assert change(server, before) == {"cancelled": 0, "finished": 1, "preempted": 0, "after_cancel": 0}


def test_a_cancelled_stream_counts_its_step_in_flight_as_cancelled(server: ServerProcess) -> None:
    settle(server)
    before = discarded(server)
    received = 0
    with SluiceClient(server.target) as client:
        stream = client.generate(MODEL, "cancel me", max_tokens=1000, seed=5, ignore_eos=True)
        for chunk in stream:
            received += len(chunk.token_ids)
            if received >= 20:
                stream.cancel()
                break
    delta = change(server, before)
    # The step computing when the cancellation arrived and the one handed over behind it (at most), and no
    # step begun after it; nothing under the reasons of streams that ended themselves.
    assert 1 <= delta["cancelled"] <= 2, delta
    assert delta["finished"] == delta["preempted"] == delta["after_cancel"] == 0, delta
