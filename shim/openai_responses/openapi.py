"""What /openapi.json says of the Responses family beyond its routes' own declarations
(shim.openapi.documented): the request and answer models its routes name, and OpenAI's error shape, which it
shares with the other OpenAI family (shim/openai_errors.py)."""

from __future__ import annotations

from typing import Any

from shim import openai_errors
from shim.openai_responses import request_models, response_models
from shim.openapi import components_of

ERROR_SCHEMA = openai_errors.ERROR_SCHEMA


def component_schemas() -> dict[str, Any]:
    """Every request and answer model of the family, by name, with the models they refer to."""
    return components_of(request_models, response_models, openai_errors)
