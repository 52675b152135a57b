"""Settings: flags parse into one frozen object; nonsense fails with a message naming the setting."""

from __future__ import annotations

import dataclasses

import pytest

from server.config import Settings


def test_flags_parse_into_settings() -> None:
    s = Settings.from_args(
        ["--max-queue", "3", "--models", "mlp", "--max-concurrency", "8", "--grace-s", "1.5"]
    )
    assert (s.max_queue, s.models, s.max_concurrency, s.grace_s) == (3, ("mlp",), 8, 1.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.max_queue = 4  # type: ignore[misc]


@pytest.mark.parametrize(
    ("flags", "name"),
    [
        (["--max-concurrency", "0"], "max_concurrency"),
        (["--max-queue", "-1"], "max_queue"),
        (["--low-watermark", "0.95", "--high-watermark", "0.9"], "low_watermark"),
        (["--max-batch-size", "0"], "max_batch_size"),
        (["--model-options", "byte-lm.size"], "model_options"),
        (["--memory-probe", "gpu"], "memory_probe"),
        (["--default-max-tokens", "5000", "--context-length", "1024"], "default_max_tokens"),
        (["--hf-models", "nameonly"], "hf_models"),
        (["--switch-interval-ms", "0"], "switch_interval_ms"),
        (["--infer-switch-interval-ms", "0"], "infer_switch_interval_ms"),
        (["--kserve-shm", "true", "--frontends", "2"], "kserve_shm"),  # front ends don't forward the peer
        (["--kserve-shm-max-regions", "0"], "kserve_shm_max_regions"),
    ],
)
def test_nonsense_names_the_setting(flags: list[str], name: str) -> None:
    with pytest.raises(ValueError, match=f"invalid setting {name}"):
        Settings.from_args(flags)


def test_models_name_what_is_served_hf_names_included() -> None:
    assert Settings().served_models == ("mlp", "byte-lm", "all-minilm-l6-v2", "smollm2")
    hf_only = Settings.from_args(["--hf-models", "gen=/models/gen"])
    assert hf_only.served_models == ("gen",) and hf_only.hf_directories == {"gen": "/models/gen"}
    both = Settings.from_args(["--hf-models", "gen=/models/gen", "--models", "mlp,gen"])
    assert both.served_models == ("mlp", "gen")


def test_an_empty_model_list_reads_as_left_out_so_the_hf_models_alone_are_served() -> None:
    hf_only = Settings.from_args(["--hf-models", "smol=/models/smol", "--models", ""])
    assert hf_only.served_models == ("smol",)
    all_embedded = ("mlp", "byte-lm", "all-minilm-l6-v2", "smollm2")
    assert Settings.from_args(["--models", ""]).served_models == all_embedded


def test_a_model_named_twice_is_served_once() -> None:
    assert Settings.from_args(["--models", "mlp,byte-lm,mlp"]).served_models == ("mlp", "byte-lm")


def test_help_gives_every_flag_its_unit_and_default() -> None:
    from server.config import parser

    text = " ".join(parser().format_help().split())
    assert "--stall-timeout-s X a stream paused this long is ended" in text
    assert "(seconds; default: 10.0)" in text
    assert "--max-concurrency N Infer slots per model (requests; default: what measured memory" in text
