"""The probes: /healthz (the process is alive), /readyz (it can take work now) and /metrics. They belong to
no API family: never admitted to the in-flight bound nor refused for a token, errors in the shim's shape."""

from __future__ import annotations

from fastapi import FastAPI

from shim.health import routes


def attach(app: FastAPI) -> None:
    app.include_router(routes.router)
