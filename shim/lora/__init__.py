"""vLLM's run-time LoRA routes as an API family: POST /v1/load_lora_adapter and /v1/unload_lora_adapter
(bodies `{lora_name, lora_path}` and `{lora_name}`) over the server's LoadLoraAdapter and UnloadLoraAdapter
RPCs, which need an admin token where the server has a keys file. Answers are vLLM's plain-text
confirmations; errors OpenAI's shape, as vLLM's OpenAI server renders them (shim/openai_errors.py).
`attach(app)` is all that shim.app knows of it."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from shim import openai_errors
from shim.families import families_of
from shim.lora import routes
from shim.openapi import components_of


def component_schemas() -> dict[str, Any]:
    return components_of(routes, openai_errors)


def attach(app: FastAPI) -> None:
    families_of(app).attach(
        app,
        routes.router,
        error_shape=openai_errors.error_response,
        schemas=component_schemas,
        error_schema=openai_errors.ERROR_SCHEMA,
        at_root=True,
    )
