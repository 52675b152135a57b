"""Priority: the order among waiting requests, which the codec decodes, admission queues and tenants cap by,
and the scheduler preempts by. Its own module, with no numpy behind it: the policies that read it are imported
by the server's Settings, which the front-end processes load."""

from __future__ import annotations

import enum


class Priority(enum.IntEnum):
    """Order among waiting requests; larger is served first."""

    LOW = 0
    NORMAL = 1
    HIGH = 2
