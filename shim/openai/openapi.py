"""What /openapi.json says of the OpenAI family beyond its routes' own declarations (shim.openapi.documented):
the models its routes name, and its error shape."""

from __future__ import annotations

from typing import Any

from shim import openai_errors
from shim.openai import request_models, response_models
from shim.openapi import components_of

#: The family's error shape (OpenAI's), for every error status its routes can answer (shim.openapi).
ERROR_SCHEMA = openai_errors.ERROR_SCHEMA


def component_schemas() -> dict[str, Any]:
    """Every request and answer model of the family, by name, with the models they refer to."""
    return components_of(request_models, response_models, openai_errors)
