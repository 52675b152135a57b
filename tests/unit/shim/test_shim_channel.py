"""channel.py: the shim's channel is the clients' channel policy, with the shim's sizes and back-off."""

from __future__ import annotations

import json

from clients.channel import ChannelSettings, channel_options, service_config
from shim.config import ShimSettings
from shim.upstream.channel import channel_settings


def test_the_shim_uses_the_clients_channel_policy() -> None:
    shim = channel_settings(ShimSettings(max_message_bytes=1234, reconnect_backoff_s=0.5))
    assert shim == ChannelSettings(max_message_bytes=1234, reconnect_backoff_s=0.5)
    # Retry policy and keepalive are the clients' own, not numbers of the shim's.
    assert json.loads(service_config(shim)) == json.loads(service_config(ChannelSettings()))
    options = dict(channel_options(shim))
    assert options["grpc.max_reconnect_backoff_ms"] == 500
    assert options["grpc.keepalive_time_ms"] == ChannelSettings().keepalive_time_s * 1000
