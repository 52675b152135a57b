"""SchemaCheck: whether a JSON value is valid against a schema, judged by the grammar the masks would use
(objects closed, keywords llguidance cannot enforce refused) over a byte vocabulary, so no model's
tokenizer is involved. For values written without the schema's mask: a strict tool's call made under the
caller's own constraint. Compiled templates are cached by schema, least recently used out."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

import llguidance

from server.errors import InvalidArgument
from server.logits.grammar import LIMITS, check_size, to_grammar
from wire.constraint import Constraint

CACHE_ENTRIES = 256
_EOS = 256


class ByteVocabulary(llguidance.TokenizerWrapper):
    """A vocabulary of the 256 bytes and an end token: a value's UTF-8 is its tokens."""

    def __init__(self) -> None:
        self.eos_token_id = _EOS
        self.bos_token_id = None
        self.tokens = [bytes([i]) for i in range(256)] + [b""]
        self.special_token_ids = [_EOS]
        self.is_tokenizer_wrapper = True
        self._accepts_bytes = True

    def _encode_string(self, s: str | bytes) -> list[int]:
        return list(s if isinstance(s, bytes) else s.encode())

    __call__ = _encode_string


class SchemaCheck:
    def __init__(self) -> None:
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._cache: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    def template(self, schema_json: str) -> llguidance.LLMatcher:
        """The schema's compiled matcher (call off the event loop the first time: a compile is ~1 ms);
        InvalidArgument naming `constraint.json_schema` where it cannot be enforced."""
        with self._lock:
            cached = self._cache.get(schema_json)
            if cached is not None:
                self._cache.move_to_end(schema_json)
                return cached
            if self._tokenizer is None:
                self._tokenizer = llguidance.LLTokenizer(ByteVocabulary(), n_vocab=_EOS + 1)
            tokenizer = self._tokenizer
        constraint = Constraint.json_schema(schema_json)
        check_size(constraint)
        template = llguidance.LLMatcher(tokenizer, to_grammar(constraint), log_level=0, limits=LIMITS)
        if template.is_error():
            raise InvalidArgument(
                f"invalid json_schema: {template.get_error()[:200]}", field="constraint.json_schema"
            )
        with self._lock:
            self._cache[schema_json] = template
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return template

    def valid(self, schema_json: str, value: object) -> bool:
        """Whether `value` (as json.loads gives it) is valid against the schema."""
        matcher = self.template(schema_json).deep_copy()
        try:
            text = json.dumps(value, ensure_ascii=False, allow_nan=False)  # the grammar's separators
        except ValueError:  # NaN or an infinity: no JSON at all
            return False
        return matcher.consume_tokens(list(text.encode())) and matcher.is_accepting()
