"""clients.channel: the retry policy covers only UNAVAILABLE on the unary methods; settings validate."""

from __future__ import annotations

import json

import pytest

from clients.channel import SERVICE_NAME, ChannelSettings, channel_options, check_timeout, service_config


def test_retry_policy_is_unavailable_only_and_excludes_generate() -> None:
    (method_config,) = json.loads(service_config(ChannelSettings()))["methodConfig"]
    assert method_config["retryPolicy"]["retryableStatusCodes"] == ["UNAVAILABLE"]
    names = {(n["service"], n["method"]) for n in method_config["name"]}
    assert names == {(SERVICE_NAME, "Infer"), (SERVICE_NAME, "ListModels"), (SERVICE_NAME, "GetModel")}


def test_options_enable_retries_and_carry_settings() -> None:
    options = dict(channel_options(ChannelSettings(max_message_bytes=1024, keepalive_time_s=5)))
    assert options["grpc.enable_retries"] == 1
    assert options["grpc.max_receive_message_length"] == 1024
    assert options["grpc.max_send_message_length"] == 1024
    assert options["grpc.keepalive_time_ms"] == 5000
    assert json.loads(str(options["grpc.service_config"]))["methodConfig"]


@pytest.mark.parametrize(
    "kwargs",
    [{"max_message_bytes": 0}, {"keepalive_time_s": 0}, {"retry_max_attempts": 1}, {"retry_max_attempts": 6}],
)
def test_invalid_settings_raise_value_error(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs)).split("_s")[0].split("_bytes")[0]):
        ChannelSettings(**kwargs)  # type: ignore[arg-type]


def test_check_timeout() -> None:
    assert check_timeout(None) is None
    assert check_timeout(1.5) == 1.5
    with pytest.raises(ValueError, match="timeout"):
        check_timeout(-1)


def test_reconnect_backoff_is_bounded_by_one_setting() -> None:
    options = dict(channel_options(ChannelSettings()))
    # gRPC's defaults (1 s growing to 120 s) would leave a restarted server unused for minutes.
    assert options["grpc.initial_reconnect_backoff_ms"] == 1000
    assert options["grpc.min_reconnect_backoff_ms"] == 1000
    assert options["grpc.max_reconnect_backoff_ms"] == 1000
    quick = dict(channel_options(ChannelSettings(reconnect_backoff_s=0.25)))
    assert quick["grpc.max_reconnect_backoff_ms"] == 250
    with pytest.raises(ValueError, match="reconnect_backoff_s"):
        ChannelSettings(reconnect_backoff_s=0)
