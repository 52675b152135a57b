"""ShimSettings: defaults, flags generated from the fields (help with unit and default), and validation
errors that name the setting."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from process.flags import add_flags, flag_name
from shim.config import ShimSettings


def test_defaults_match_the_documented_values() -> None:
    settings = ShimSettings.from_args([])
    assert settings == ShimSettings()
    assert settings.upstream == "127.0.0.1:50051"
    assert (settings.host, settings.port) == ("127.0.0.1", 8000)
    assert settings.max_body_bytes == 1 << 20
    assert settings.max_inflight == 512
    assert settings.max_connections is None
    assert (settings.header_timeout_s, settings.body_timeout_s, settings.idle_timeout_s) == (10.0, 30.0, 5.0)
    assert settings.infer_timeout_s == 60.0
    assert settings.generate_timeout_s == 600.0
    assert settings.sse_heartbeat_s == 15.0
    assert settings.reconnect_backoff_s == 1.0
    assert settings.cors_allow_origins == ()


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
            "--max-connections",
            "40",
            "--header-timeout-s",
            "2",
            "--body-timeout-s",
            "3",
            "--idle-timeout-s",
            "0.5",
            "--infer-timeout-s",
            "1.5",
            "--generate-timeout-s",
            "20",
            "--sse-heartbeat-s",
            "0.5",
            "--reconnect-backoff-s",
            "0.25",
            "--cors-allow-origins",
            "http://a.example, https://b.example:8443",
        ]
    )
    assert settings == ShimSettings(
        upstream="10.0.0.1:9000",
        host="0.0.0.0",
        port=0,
        max_body_bytes=2048,
        max_inflight=3,
        max_connections=40,
        header_timeout_s=2.0,
        body_timeout_s=3.0,
        idle_timeout_s=0.5,
        infer_timeout_s=1.5,
        generate_timeout_s=20.0,
        sse_heartbeat_s=0.5,
        reconnect_backoff_s=0.25,
        cors_allow_origins=("http://a.example", "https://b.example:8443"),
    )
    assert ShimSettings.from_args(["--max-connections", "auto"]).max_connections is None


def test_every_flag_has_help_with_its_default_generated_from_the_field() -> None:
    # Wide enough that argparse does not wrap (and hyphenate) any help text.
    parser = argparse.ArgumentParser(
        prog="sluice shim", formatter_class=lambda prog: argparse.HelpFormatter(prog, width=10_000)
    )
    add_flags(parser, ShimSettings)
    text = parser.format_help()
    for field in dataclasses.fields(ShimSettings):
        assert field.metadata["help"], field.name
        assert flag_name(field.name) in text
        assert f"{field.metadata['help']} (" in text, field.name
        if field.name.endswith("_s"):
            assert field.metadata["unit"] == "seconds", field.name
        if field.name.endswith("_bytes"):
            assert field.metadata["unit"] == "bytes", field.name
    assert "(seconds; default: 10.0)" in text
    assert "(bytes; default: 1048576)" in text
    assert "(default: none)" in text  # cors_allow_origins


def test_a_flag_without_a_field_does_not_exist() -> None:
    with pytest.raises(SystemExit):
        ShimSettings.from_args(["--stream-buffer-events", "4"])


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--port", "70000"], "port"),
        (["--port", "-1"], "port"),
        (["--max-body-bytes", "0"], "max_body_bytes"),
        (["--max-inflight", "0"], "max_inflight"),
        (["--max-connections", "0"], "max_connections"),
        (["--header-timeout-s", "0"], "header_timeout_s"),
        (["--body-timeout-s", "inf"], "body_timeout_s"),
        (["--idle-timeout-s", "-1"], "idle_timeout_s"),
        (["--infer-timeout-s", "0"], "infer_timeout_s"),
        (["--generate-timeout-s", "-3"], "generate_timeout_s"),
        (["--sse-heartbeat-s", "nan"], "sse_heartbeat_s"),
        (["--reconnect-backoff-s", "0"], "reconnect_backoff_s"),
        (["--cors-allow-origins", "example.com"], "cors_allow_origins"),
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
