"""Sampling: the one definition of a Generate request's sampling settings (as vLLM's `SamplingParams`):
each field's default, its range and its count limit, shared by the clients (which build requests from it),
the shim's families (whose request models convert with one `to_sampling()`), the server's codec (which
decodes requests into it and asks `violation()` once) and the scheduler (which decides max_tokens).

Its fields are the proto's SamplingParams fields, by name: `to_proto` and `from_proto` map them through the
message descriptor, so a new setting is a proto field, a field here (default and range in its metadata),
and its use in the sampler. Unset (None, or an empty tuple) leaves the server's default: proto3 `optional`
presence carries that, and the default is declared here, once. Limits that are the server's settings
(stop sequences) are the scheduler's to check (server/batching/requests.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sluice.inference.v1 import inference_pb2 as pb

#: Alternatives per token a request may ask for (`logprobs`), as OpenAI's completions API allows: each costs
#: a top-k over the vocabulary. The server refuses more; the shim's OpenAI models validate against it too.
MAX_LOGPROBS = 5


@dataclass(frozen=True, slots=True)
class Bound:
    """A field's range: `low` inclusive (exclusive where `open_low`), `high` inclusive; NaN and the
    infinities are always outside."""

    low: float | None = None
    high: float | None = None
    open_low: bool = False
    wording: str = ""  # how the message says the range, where not as an interval

    def holds(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.open_low else value < self.low):
            return False
        return self.high is None or value <= self.high

    def describe(self) -> str:
        if self.wording:
            return self.wording
        if self.high is None:
            return f"{'>' if self.open_low else '>='} {self.low}"
        return f"in {'(' if self.open_low else '['}{self.low}, {self.high}]"


@dataclass(frozen=True, slots=True)
class Count:
    """A bound on how many entries a repeated or map field holds; past it is LIMIT_EXCEEDED, with the
    limit in the error's metadata under `key`."""

    most: int
    key: str
    noun: str  # what the message counts, e.g. "logit_bias entries"


@dataclass(frozen=True, slots=True)
class Violation:
    """The first setting out of its range: `field` is its path under `sampling.` (e.g. `top_p`,
    `logit_bias[7]`); `limit` is set where a count went past its limit (LIMIT_EXCEEDED, this metadata)."""

    field: str
    message: str
    limit: Mapping[str, int] | None = None


def _setting(
    *, default: Any = None, bound: Bound | None = None, each: Bound | None = None, count: Count | None = None
) -> Any:
    """A field's metadata: the server's value when it is unset (None: the server decides per request),
    its range, its entries' range (map values), its count."""
    return {"default": default, "bound": bound, "each": each, "count": count}


@dataclass(frozen=True, slots=True, kw_only=True)
class Sampling:
    """What a caller asks of one generation; see SamplingParams in inference.proto for each field. None is
    unset (and stays unset on the wire): the server reads it as the field's declared default (DEFAULTS),
    or decides (max_tokens), draws (seed) or gives none (logprobs)."""

    max_tokens: int | None = field(default=None, metadata=_setting(bound=Bound(0, open_low=True)))
    temperature: float | None = field(default=None, metadata=_setting(default=1.0, bound=Bound(0)))
    top_p: float | None = field(
        default=None, metadata=_setting(default=1.0, bound=Bound(0, 1, open_low=True))
    )
    top_k: int | None = field(default=None, metadata=_setting(default=0, bound=Bound(0)))  # 0: no limit
    seed: int | None = None
    stop: tuple[str, ...] = ()
    # At most max_tokens, which the scheduler decides: checked there.
    min_tokens: int | None = field(default=None, metadata=_setting(default=0))
    ignore_eos: bool = False
    logprobs: int | None = field(
        default=None, metadata=_setting(bound=Bound(0, MAX_LOGPROBS, wording=f"between 0 and {MAX_LOGPROBS}"))
    )
    presence_penalty: float | None = field(default=None, metadata=_setting(default=0.0, bound=Bound(-2, 2)))
    frequency_penalty: float | None = field(default=None, metadata=_setting(default=0.0, bound=Bound(-2, 2)))
    repetition_penalty: float | None = field(
        default=None, metadata=_setting(default=1.0, bound=Bound(0, open_low=True))
    )
    # (token id, bias) pairs, sorted by token id; 300 entries is OpenAI's limit.
    logit_bias: tuple[tuple[int, float], ...] = field(
        default=(),
        metadata=_setting(each=Bound(-100, 100), count=Count(300, "max_logit_bias", "logit_bias entries")),
    )
    stop_token_ids: tuple[int, ...] = field(
        default=(), metadata=_setting(count=Count(64, "max_stop_token_ids", "stop_token_ids"))
    )

    @classmethod
    def of(cls, fields: Mapping[str, Any]) -> Sampling:
        """From keyword arguments or a protocol model's fields of the same names (a client's
        `generate(..., max_tokens=16)`); None leaves a field at its default; a `stop` string is one
        stop sequence; `logit_bias` keys may be digit strings (JSON's); an unknown name is a TypeError."""
        unknown = set(fields) - FIELDS
        if unknown:
            raise TypeError(f"unknown sampling setting(s) {sorted(unknown)}; known: {sorted(FIELDS)}")
        values = {name: value for name, value in fields.items() if value is not None}
        stop = values.get("stop")
        if stop is not None:
            values["stop"] = (stop,) if isinstance(stop, str) else tuple(stop)
        bias = values.get("logit_bias")
        if bias is not None:
            pairs = bias.items() if isinstance(bias, Mapping) else bias
            values["logit_bias"] = tuple(sorted((int(k), float(v)) for k, v in pairs))
        if "stop_token_ids" in values:
            values["stop_token_ids"] = tuple(values["stop_token_ids"])
        return cls(**values)

    def violation(self) -> Violation | None:
        """The first setting outside its declared range or count, in field order; None if all hold."""
        for spec in _CHECKED:
            value = getattr(self, spec.name)
            bound, each, count = spec.metadata["bound"], spec.metadata["each"], spec.metadata["count"]
            if value is None or value == ():
                continue  # unset: the default, which holds
            if bound is not None and not bound.holds(value):
                return Violation(spec.name, f"{spec.name} must be {bound.describe()}, got {value}")
            if count is not None and len(value) > count.most:
                message = f"{len(value)} {count.noun}; at most {count.most}"
                return Violation(spec.name, message, {count.key: count.most})
            if each is not None:
                for key, entry in value:
                    if not each.holds(entry):
                        message = f"{spec.name} values must be {each.describe()}, got {entry}"
                        return Violation(f"{spec.name}[{key}]", message)
        return None

    def to_proto(self) -> pb.SamplingParams:
        message = pb.SamplingParams()
        for spec in _FIELDS:
            value = getattr(self, spec.name)
            if value == spec.default:
                continue  # unset: the server's default applies
            if spec.name in _MAPS:
                getattr(message, spec.name).update(dict(value))
            elif isinstance(value, tuple):
                getattr(message, spec.name).extend(value)
            else:
                setattr(message, spec.name, value)
        return message

    @classmethod
    def from_proto(cls, proto: pb.SamplingParams) -> Sampling:
        message: Any = proto  # fields by name: the typed stubs know each name only as a literal
        values: dict[str, Any] = {}
        for spec in _FIELDS:
            if spec.name in _MAPS:
                values[spec.name] = tuple(sorted(getattr(message, spec.name).items()))
            elif _REPEATED[spec.name]:
                values[spec.name] = tuple(getattr(message, spec.name))
            elif message.HasField(spec.name):
                values[spec.name] = getattr(message, spec.name)
        return cls(**values)


_FIELDS = dataclasses.fields(Sampling)
FIELDS = frozenset(f.name for f in _FIELDS)
_CHECKED = tuple(f for f in _FIELDS if f.metadata)
# The value an unset field has on the server (the scheduler resolves with these).
DEFAULTS: Mapping[str, Any] = {
    f.name: f.metadata["default"] for f in _CHECKED if f.metadata["default"] is not None
}
BOUNDS: Mapping[str, Bound] = {f.name: f.metadata["bound"] for f in _CHECKED if f.metadata["bound"]}
_PROTO = pb.SamplingParams.DESCRIPTOR.fields_by_name
_REPEATED = {name: bool(_PROTO[name].is_repeated) for name in FIELDS}  # a KeyError: a field the proto lacks
_MAPS = frozenset(name for name in FIELDS if _PROTO[name].message_type is not None)  # map<,> fields
