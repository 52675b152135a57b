"""RequestExtras: what one generation carries to the scheduler beyond its prompt and sampling, resolved once
per request for every API that submits a Generate (server/submission.py): the LoRA adapter its model name
addresses (vLLM's LoRARequest: an adapter is served under a model name of its own), and the prefix cache's
salt, which holds the tenant's namespace and the adapter, since the same tokens under another adapter hold
other keys and values.

A per-request model extra lands here and nowhere else on the way in: a field, and the line in `of` that
resolves it from the decoded request; the step hands the extras to the runtime row by row
(server/runtimes/step_batch.py)."""

from __future__ import annotations

from dataclasses import dataclass

from server.domain import GenerateSpec
from server.runtimes.base import GenerativeModel
from server.runtimes.lora import LoraAdapter


@dataclass(frozen=True, slots=True)
class RequestExtras:
    # The prefix cache's namespace: the calling tenant's salt, or a group's the keys file shares ("": no
    # tenant), and the adapter's load. Blocks are shared only between requests of one salt.
    salt: str = ""
    # The adapter the request's model name addresses; None: the base model. Held by the sequence, so an
    # unload never takes the weights from under it.
    adapter: LoraAdapter | None = None

    @classmethod
    def of(
        cls, spec: GenerateSpec, *, tenant_salt: str, model: GenerativeModel | None = None
    ) -> RequestExtras:
        """The extras of the decoded request `spec` from the caller `tenant_salt` names, to run on `model`
        (the replica admission chose: what it serves, such as its adapters by name)."""
        adapter = model.adapters.get(spec.model) if model is not None else None
        if adapter is None:
            return cls(salt=tenant_salt)
        # Unique per load: a reload under the same name never reads what the former weights wrote.
        return cls(salt=f"{tenant_salt}\x00lora:{adapter.uid}", adapter=adapter)
