"""--lora-modules entries: NAME=PATH split by the server's one NAME=VALUE rule (server/model_selection.py),
each refusal naming the setting."""

from __future__ import annotations

import pytest

from server.lora_flags import parse_lora_modules


def test_entries_split_at_the_first_equals_and_are_trimmed() -> None:
    assert parse_lora_modules((" sql = /a/b=c ", "chat=/d")) == [("sql", "/a/b=c"), ("chat", "/d")]


@pytest.mark.parametrize("entry", ["sql", "=/a", "sql=", " = "])
def test_an_entry_without_a_name_or_a_path_is_refused(entry: str) -> None:
    with pytest.raises(ValueError, match=r"invalid setting lora_modules: .* is not NAME=PATH"):
        parse_lora_modules((entry,))


def test_repeated_names_are_refused() -> None:
    with pytest.raises(ValueError, match="adapter names repeat"):
        parse_lora_modules(("a=/x", "a=/y"))
