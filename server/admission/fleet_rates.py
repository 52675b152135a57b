"""FleetRates: tenants' request rates held across replicas in a shared store (`--tenant-store`, Redis), so a
tenant limited to R requests/s gets R across the fleet, not R per replica.

One token bucket per tenant in Redis, as each replica keeps locally (server/admission/tenants.py: R tokens
a second, at most R held): a Lua script refills and takes a token atomically, on the store's own clock
(`TIME`: the replicas' clocks never meet), and answers the wait before the next token when none is left.
A token bucket, not the `limits` package's windows: the same burst and refill as the per-replica limit, so
adding a store changes where the limit is counted, not what it is; both cost one round trip a call.

Each replica also announces itself every second (a sorted set of replica ids by last heartbeat) and counts
the replicas heard from in the last few seconds. When the store cannot be reached the replica falls back to
its local share of the rate: R / the replicas last counted (R alone if it never reached the store), so the
fleet as a whole still allows about R and no replica refuses everyone; `sluice_tenant_store_up` drops to 0,
every call the fallback decides counts in `sluice_tenant_store_fallbacks_total`, and one log line says so.
The heartbeat keeps trying; the first answer restores the fleet-wide limit (and another log line).

The call is made on the event loop, blocking, with a short socket timeout (`--tenant-store-timeout-s`): a
loopback round trip is ~0.1-0.3 ms, less than the rest of admission, and a failure opens the fallback at
once, so an unreachable store costs one timeout, not one per call."""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from server.metrics import Metrics

_log = logging.getLogger("sluice.admission")
_KEY = "sluice:tenant-rate:"
_REPLICAS = "sluice:replicas"
_HEARTBEAT_S = 1.0
_ALIVE_S = 5.0  # a replica not heard from for this long is not counted in the local share

# KEYS[1]: the tenant's bucket; ARGV: rate per second. Returns "0" when a token was taken, else the wait
# in seconds before one is (as text: Lua numbers come back to clients as integers).
_TAKE = """
local rate = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local held = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(held[1]) or rate
local at = tonumber(held[2]) or now
tokens = math.min(rate, tokens + math.max(0, now - at) * rate)
local wait = '0'
if tokens < 1 then
  wait = tostring((1 - tokens) / rate)
else
  tokens = tokens - 1
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(1000 * (2 + 1 / rate)))
return wait
"""

# KEYS[1]: the replicas' set; ARGV: this replica's id, how long one counts. Returns the replicas alive.
_HEARTBEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('EXPIRE', KEYS[1], 60)
return redis.call('ZCARD', KEYS[1])
"""


class FleetRates:
    def __init__(self, url: str, metrics: Metrics, *, timeout_s: float = 0.05) -> None:
        import redis  # only a server with a store imports the client
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.url = url
        self.metrics = metrics
        self.replica = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self.replicas = 1  # the fleet's size as last counted in the store (1 until it is)
        self.up = False
        # No retries (redis-py's default is 10 with back-off): a call waits one timeout at most, then this
        # replica decides alone; the heartbeat is what tries again.
        self._client = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 0)
        )
        self._take = self._client.register_script(_TAKE)
        self._heartbeat = self._client.register_script(_HEARTBEAT)
        self._stop = threading.Event()
        self._lock = threading.Lock()  # `up` is written by the heartbeat thread and the event loop
        self._warned = False  # the first failure is logged even when the store was never up
        self._beat()  # at start: the fleet's size and the store's state before the first call
        self._thread = threading.Thread(target=self._run, name="tenant-store", daemon=True)
        self._thread.start()

    def take(self, tenant: str, rate_per_s: float) -> float | None:
        """The wait before `tenant` may call again (0: a token was taken), or None while the store is down:
        then the caller applies `local_rate()`."""
        if not self.up:
            self.metrics.tenant_store_fallbacks.inc()
            return None
        try:
            answer: Any = self._take(keys=[_KEY + tenant], args=[repr(rate_per_s)])
        # Whatever the client raises (a connection error, a reply cut short by a dying server, a closed
        # pool): the store is optional, and a call must not fail because of it.
        except Exception as error:
            self._down(error)
            self.metrics.tenant_store_fallbacks.inc()
            return None
        return float(answer)

    def local_rate(self, rate_per_s: float) -> float:
        """This replica's share of a fleet-wide rate while the store is down."""
        return rate_per_s / max(1, self.replicas)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._client.close()

    def _run(self) -> None:
        while not self._stop.wait(_HEARTBEAT_S):
            self._beat()

    def _beat(self) -> None:
        try:
            self.replicas = max(1, int(self._heartbeat(keys=[_REPLICAS], args=[self.replica, _ALIVE_S])))
        except Exception as error:  # as in take(): any failure is the store's
            self._down(error)
            return
        with self._lock:
            was_up, self.up = self.up, True
        self.metrics.tenant_store_up.set(1)
        if not was_up:
            _log.warning("tenant store %s reachable: tenants' rates are held fleet-wide (%d replicas)",
                         self.url, self.replicas)  # fmt: skip

    def _down(self, error: BaseException) -> None:
        with self._lock:
            was_up, self.up = self.up, False
        self.metrics.tenant_store_up.set(0)
        if was_up or not self._warned:
            self._warned = True
            _log.warning(
                "tenant store %s unreachable (%s): each tenant's rate falls back to this replica's share, "
                "1/%d of it, until the store answers again", self.url, error, self.replicas,
            )  # fmt: skip
