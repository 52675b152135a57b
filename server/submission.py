"""How a decoded call reaches its model, for both APIs on the port (Sluice's InferenceService and KServe
v2): the replica admission chose (NOT_FOUND for a model not served here) and the call's deadline; for a
Generate, the request's extras resolved once (server/batching/extras.py: the LoRA adapter its model name
addresses, the prefix-cache salt), its constraint compiled off the event loop, then the
scheduler's submit; for a Tokenize or Detokenize, the model's tokenizer asked on the event loop, as a
Generate's tokenizing is (server/batching/requests.py): one tokenizer call, no model step. Decoding and
answering stay with each API's servicer."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from server.admission.devices import CHOSEN
from server.admission.handlers import ADMISSION_WAIT
from server.admission.tenants import CALLER, Tenant
from server.batching.continuous import ContinuousScheduler
from server.batching.extras import RequestExtras
from server.batching.requests import check_vocabulary
from server.batching.sequence import GenSequence
from server.domain import GenerateSpec, TokenizeSpec
from server.errors import InvalidArgument, ModelNotFound, SluiceError, clip
from server.runtimes.base import GenerativeModel

Context = grpc.aio.ServicerContext[Any, Any]
Replica = TypeVar("Replica")


def chosen_replica(replicas: Mapping[str, Sequence[Replica]], model: str) -> Replica:
    """The replica of `model` on the device admission admitted the call on; NOT_FOUND naming the models
    served this way where `model` is not one of them."""
    found = replicas.get(model)
    if found is None:
        raise ModelNotFound(model, list(replicas))
    return found[CHOSEN.get()]


def call_deadline(context: Context) -> float | None:
    """The call's deadline on the monotonic clock; None where the caller set none."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


@dataclass(frozen=True, slots=True)
class Submitted:
    """A generation queued to join its scheduler: the scheduler streams its chunks; the tenant is billed."""

    scheduler: ContinuousScheduler
    seq: GenSequence
    tenant: Tenant | None


async def submit_generation(
    schedulers: Mapping[str, Sequence[ContinuousScheduler]],
    spec: GenerateSpec,
    context: Context,
    *,
    on_release: Callable[[], None] | None,
) -> Submitted:
    """Raises SluiceError before anything is queued, in this order: the model (NOT_FOUND), the constraint
    (compiled on a thread, or refused for its size first), then the model's limits (the scheduler's own
    checks). `on_release` gives the admission slot back once the sequence has left its KV region."""
    scheduler = chosen_replica(schedulers, spec.model)
    deadline = call_deadline(context)
    tenant = CALLER.get()
    salt = tenant.entry.cache_salt if tenant is not None else ""
    extras = RequestExtras.of(spec, tenant_salt=salt, model=scheduler.model)
    matcher = await scheduler.prepare(spec)
    seq = scheduler.submit(
        spec,
        on_release=on_release,
        deadline=deadline,
        extras=extras,
        matcher=matcher,
        admission_wait_s=ADMISSION_WAIT.get(),
    )
    return Submitted(scheduler, seq, tenant)


def tokenize(model: GenerativeModel, spec: TokenizeSpec) -> list[int]:
    """The token ids; a conversation the chat template refuses (a template may raise on roles out of order)
    is INVALID_ARGUMENT naming the messages, with the template's own words."""
    if spec.chat is None:
        return model.tokenize(spec.text or "", add_special_tokens=spec.add_special_tokens)
    try:
        return model.chat_tokens(spec.chat, spec.tools, add_generation_prompt=spec.add_generation_prompt)
    except SluiceError:
        raise
    except Exception as exc:  # jinja2's TemplateError, a template's raise_exception(), a tokenizer's own
        raise InvalidArgument(
            f"the model's chat template refused the conversation: {clip(str(exc))}", field="chat.messages"
        ) from None


def detokenize(model: GenerativeModel, token_ids: Sequence[int]) -> str:
    """The text; a token id outside the vocabulary is refused naming its position."""
    check_vocabulary(token_ids, model.vocab_size, "token_ids")
    return model.detokenize(token_ids)
