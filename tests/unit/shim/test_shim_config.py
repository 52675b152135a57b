"""ShimSettings: defaults, flag parsing, and validation errors that name the setting."""

from __future__ import annotations

import pytest

from shim.config import ShimSettings


def test_defaults_match_the_documented_values() -> None:
    settings = ShimSettings.from_args([])
    assert settings.upstream == "127.0.0.1:50051"
    assert (settings.host, settings.port) == ("127.0.0.1", 8000)
    assert settings.max_body_bytes == 1 << 20
    assert settings.max_inflight == 512
    assert settings.infer_timeout_s == 60.0
    assert settings.generate_timeout_s == 600.0
    assert settings.sse_heartbeat_s == 15.0
    assert settings.stream_buffer_events == 16


def test_flags_are_parsed() -> None:
    settings = ShimSettings.from_args(
        [
            "--upstream",
            "10.0.0.1:9000",
            "--host",
            "0.0.0.0",
            "--port",
            "0",
            "--max-body-bytes",
            "2048",
            "--max-inflight",
            "3",
            "--infer-timeout-s",
            "1.5",
            "--generate-timeout-s",
            "20",
            "--sse-heartbeat-s",
            "0.5",
            "--stream-buffer-events",
            "4",
        ]
    )
    assert settings == ShimSettings(
        upstream="10.0.0.1:9000",
        host="0.0.0.0",
        port=0,
        max_body_bytes=2048,
        max_inflight=3,
        infer_timeout_s=1.5,
        generate_timeout_s=20.0,
        sse_heartbeat_s=0.5,
        stream_buffer_events=4,
    )


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--port", "70000"], "port"),
        (["--port", "-1"], "port"),
        (["--max-body-bytes", "0"], "max_body_bytes"),
        (["--max-inflight", "0"], "max_inflight"),
        (["--stream-buffer-events", "0"], "stream_buffer_events"),
        (["--infer-timeout-s", "0"], "infer_timeout_s"),
        (["--generate-timeout-s", "-3"], "generate_timeout_s"),
        (["--sse-heartbeat-s", "nan"], "sse_heartbeat_s"),
        (["--upstream", " "], "upstream"),
    ],
)
def test_invalid_values_raise_value_error_naming_the_setting(flags: list[str], named: str) -> None:
    with pytest.raises(ValueError, match=rf"^{named} "):
        ShimSettings.from_args(flags)


def test_settings_are_frozen() -> None:
    settings = ShimSettings()
    with pytest.raises(AttributeError):
        settings.port = 1  # type: ignore[misc]
