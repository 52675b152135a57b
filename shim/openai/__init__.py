"""The OpenAI-compatible API: routes (argument wiring) -> request_models (pydantic shapes) -> serving
modules (chat, completions, embeddings: translate, call, stream) over the shim's one gRPC channel, with
errors in OpenAI's shape from the shim's one code table."""
