"""The native JSON API family (/v1/infer, /v1/generate, /v1/sluice/models): routes (argument wiring) ->
request_models (pydantic shapes) -> translate (JSON <-> protobuf) and generation (a generation's collected
answer or its token/done/error events). Its errors are the shim's own shape. `attach(app)` is all that
shim.app knows of it."""

from __future__ import annotations

from fastapi import FastAPI

from shim.families import families_of, shim_shape
from shim.native import request_models, routes
from shim.openapi import components_of


def attach(app: FastAPI) -> None:
    families_of(app).attach(
        app, routes.router, error_shape=shim_shape, schemas=lambda: components_of(request_models)
    )
