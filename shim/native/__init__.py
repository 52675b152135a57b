"""The native JSON API (/v1/infer, /v1/generate, /v1/sluice/models)."""
