"""Sampling: the one shape of a Generate request's sampling settings, shared by the clients (which build
requests from it), the shim's families (which translate their JSON into it), the server's codec (which
decodes requests into it) and the scheduler (which resolves its defaults).

Its fields are the proto's SamplingParams fields, by name: `to_proto` and `from_proto` map them through the
message descriptor, so a new setting is a proto field, a field here, and its use in the scheduler.
Unset (None, or the field's default) leaves the server's default; proto3 `optional` presence carries that.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sluice.inference.v1 import inference_pb2 as pb

#: Alternatives per token a request may ask for (`logprobs`), as OpenAI's completions API allows: each costs
#: a top-k over the vocabulary. The server refuses more; the shim's OpenAI models validate against it too.
MAX_LOGPROBS = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class Sampling:
    """What a caller asks of one generation; see SamplingParams in inference.proto for each field."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    min_tokens: int | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs, sorted by token id
    stop_token_ids: tuple[int, ...] = ()

    @classmethod
    def of(cls, fields: Mapping[str, Any]) -> Sampling:
        """From keyword arguments (a client's `generate(..., max_tokens=16)`); a `stop` string is one stop
        sequence; an unknown name is a TypeError naming it."""
        unknown = set(fields) - FIELDS
        if unknown:
            raise TypeError(f"unknown sampling setting(s) {sorted(unknown)}; known: {sorted(FIELDS)}")
        values = dict(fields)
        stop = values.get("stop")
        if stop is not None:
            values["stop"] = (stop,) if isinstance(stop, str) else tuple(stop)
        else:
            values.pop("stop", None)
        bias = values.get("logit_bias")
        if bias is not None:
            pairs = bias.items() if isinstance(bias, Mapping) else bias
            values["logit_bias"] = tuple(sorted((int(k), float(v)) for k, v in pairs))
        if values.get("stop_token_ids") is not None:
            values["stop_token_ids"] = tuple(values["stop_token_ids"])
        return cls(**{k: v for k, v in values.items() if v is not None or k not in _TUPLES})

    def to_proto(self) -> pb.SamplingParams:
        message = pb.SamplingParams()
        for field in _FIELDS:
            value = getattr(self, field.name)
            if value == field.default:
                continue  # unset: the server's default applies
            if field.name in _MAPS:
                getattr(message, field.name).update(dict(value))
            elif isinstance(value, tuple):
                getattr(message, field.name).extend(value)
            else:
                setattr(message, field.name, value)
        return message

    @classmethod
    def from_proto(cls, proto: pb.SamplingParams) -> Sampling:
        message: Any = proto  # fields by name: the typed stubs know each name only as a literal
        values: dict[str, Any] = {}
        for field in _FIELDS:
            if field.name in _MAPS:
                values[field.name] = tuple(sorted(getattr(message, field.name).items()))
            elif _REPEATED[field.name]:
                values[field.name] = tuple(getattr(message, field.name))
            elif message.HasField(field.name):
                values[field.name] = getattr(message, field.name)
        return cls(**values)


_FIELDS = dataclasses.fields(Sampling)
FIELDS = frozenset(f.name for f in _FIELDS)
_PROTO = pb.SamplingParams.DESCRIPTOR.fields_by_name
_REPEATED = {name: bool(_PROTO[name].is_repeated) for name in FIELDS}  # a KeyError: a field the proto lacks
_MAPS = frozenset(name for name in FIELDS if _PROTO[name].message_type is not None)  # map<,> fields
_TUPLES = frozenset(f.name for f in _FIELDS if isinstance(f.default, tuple))
