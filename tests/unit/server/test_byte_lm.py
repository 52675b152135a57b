"""The byte LM's cache paths agree: batched prefill equals one-by-one prefill, and a decode step equals
prefilling the longer prompt."""

from __future__ import annotations

import torch

from server.runtimes.byte_lm import ByteLm


def test_batched_prefill_equals_one_by_one() -> None:
    with torch.inference_mode():
        model = ByteLm(size="tiny", context_length=64, max_sequences=4, device=torch.device("cpu"))
        model.allocate_cache(4, 64)
        prompts = [(0, [72, 101, 108]), (1, list(range(40, 60))), (2, [65]), (3, list(range(30, 37)))]
        singles = torch.stack([model.prefill(slot, ids) for slot, ids in prompts])
        keys = model.k_cache.clone()
        model.k_cache.zero_()
        batched = model.prefill_many(prompts)
        torch.testing.assert_close(batched, singles, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(model.k_cache, keys, atol=1e-5, rtol=1e-5)


def test_decode_after_prefill_equals_prefill_of_the_longer_prompt() -> None:
    with torch.inference_mode():
        model = ByteLm(size="tiny", context_length=64, max_sequences=4, device=torch.device("cpu"))
        model.allocate_cache(4, 64)
        ids = [72, 101, 108, 108, 111]
        token = int(model.prefill(0, ids).argmax())
        model.prefill(3, ids)
        stepped = model.decode([0, 3], torch.tensor([token, token]), torch.tensor([5, 5]))
        whole = model.prefill(1, [*ids, token])
        torch.testing.assert_close(stepped[0], whole, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(stepped[1], whole, atol=1e-4, rtol=1e-4)
