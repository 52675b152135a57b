"""RequestExtras: what one generation carries to the scheduler beyond its prompt and sampling, resolved once
per request for every API that submits a Generate (server/submission.py): today the prefix cache's salt.

A per-request model extra lands here and nowhere else on the way in: a field, and the line in `of` that
resolves it from the decoded request. vLLM's LoRARequest is the example: an adapter named by the request
is resolved once, travels with the sequence to the step, and is part of the prefix cache's key, since the
same tokens under another adapter hold other keys and values."""

from __future__ import annotations

from dataclasses import dataclass

from server.domain import GenerateSpec


@dataclass(frozen=True, slots=True)
class RequestExtras:
    # The prefix cache's namespace: the calling tenant's salt, or a group's the keys file shares ("": no
    # tenant). Blocks are shared only between requests of one salt.
    salt: str = ""

    @classmethod
    def of(cls, spec: GenerateSpec, *, tenant_salt: str) -> RequestExtras:
        """The extras of the decoded request `spec` from the caller `tenant_salt` names."""
        del spec  # nothing it asks changes the model yet; an adapter's name would be read here
        return cls(salt=tenant_salt)
