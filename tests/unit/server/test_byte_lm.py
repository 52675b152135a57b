"""The byte LM's cache paths agree: batched prefill equals one-by-one prefill, a prompt prefilled in chunks
(or after a cached prefix copied from another region) equals it whole, a decode step equals prefilling the
longer prompt, and the served forward equals the tests' eager reference (tests/support/byte_lm_reference)."""

from __future__ import annotations

import torch

from server.runtimes.base import Prefill
from server.runtimes.byte_lm import ByteLm
from tests.support import byte_lm_reference

NONE = torch.empty(0, dtype=torch.long)


def model() -> ByteLm:
    lm = ByteLm(size="tiny", context_length=64, max_sequences=4, device=torch.device("cpu"))
    lm.allocate_cache(4 * 64)
    return lm


def test_batched_prefill_equals_one_by_one() -> None:
    with torch.inference_mode():
        lm = model()
        prompts = [Prefill(0, [72, 101, 108]), Prefill(64, list(range(40, 60))), Prefill(128, [65]),
                   Prefill(192, list(range(30, 37)))]  # fmt: skip
        singles = torch.stack([lm.prefill(p.base, p.token_ids) for p in prompts])
        keys = lm.kv.k.clone()
        lm.kv.k.zero_()
        batched = lm.prefill_many(prompts)
        torch.testing.assert_close(batched, singles, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(lm.kv.k, keys, atol=1e-5, rtol=1e-5)


def test_a_prompt_in_chunks_or_after_a_copied_prefix_equals_it_whole() -> None:
    with torch.inference_mode():
        lm = model()
        ids = list(range(50, 90))
        whole = lm.prefill(0, ids)
        lm.prefill(64, ids[:16])
        chunked = lm.prefill(64, ids[16:], 16)
        lm.move_kv([(0, 128, 32)])  # as a prefix-cache hit: the first 32 tokens' keys and values copied
        after_copy = lm.prefill(128, ids[32:], 32)
        torch.testing.assert_close(chunked, whole, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(after_copy, whole, atol=1e-4, rtol=1e-4)


def test_decode_after_prefill_equals_prefill_of_the_longer_prompt() -> None:
    with torch.inference_mode():
        lm = model()
        ids = [72, 101, 108, 108, 111]
        token = int(lm.prefill(0, ids).argmax())
        lm.prefill(192, ids)
        stepped = lm.decode([0, 192], torch.tensor([token, token]), torch.tensor([5, 5]))
        whole = lm.prefill(64, [*ids, token])
        torch.testing.assert_close(stepped[0], whole, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(stepped[1], whole, atol=1e-4, rtol=1e-4)


def test_the_served_forward_is_the_plain_causal_transformer_the_tests_compare_with() -> None:
    """The integration tests' reference (an eager forward from the module's weights) is this model."""
    with torch.inference_mode():
        lm = model()
        ids = list(b"The sluice gate opens at dawn.")
        torch.testing.assert_close(
            lm.prefill(0, ids), byte_lm_reference.logits(lm, ids), atol=1e-4, rtol=1e-4
        )
