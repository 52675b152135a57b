"""A repeated tool call (issue 38 item 5): a call identical to one already made, in name and arguments,
ends the calls as soon as its JSON closes and is never reported; a call that differs, even only in an
argument or its keys' order of no matter, is judged by its value."""

from __future__ import annotations

from server.tools.output import ToolOutput

NAMES = frozenset({"get_weather", "get_time"})


def call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>\n'


def feed_by_char(out: ToolOutput, text: str) -> int:
    """Feeds one character at a time (as tokens come); how many were fed when the calls ended."""
    for fed, char in enumerate(text, start=1):
        out.feed(char)
        if out.repeated:
            return fed
    return len(text)


def test_an_identical_call_ends_the_calls_as_its_json_closes() -> None:
    paris = call("get_weather", '{"city": "Paris"}')
    out = ToolOutput(NAMES, required=True)
    fed = feed_by_char(out, paris + paris + paris)
    assert out.repeated
    assert fed == len(paris) + paris.index("}}") + 2  # the second call's JSON has just closed
    rest, calls = out.finish()
    assert rest == "" and [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Paris"}')]


def test_calls_that_differ_are_all_made() -> None:
    text = call("get_weather", '{"city": "Paris"}') + call("get_weather", '{"city": "Oslo"}')
    text += call("get_time", '{"city": "Paris"}')
    out = ToolOutput(NAMES, required=True)
    feed_by_char(out, text)
    assert not out.repeated
    assert [c.arguments for c in out.finish()[1]] == [
        '{"city": "Paris"}',
        '{"city": "Oslo"}',
        '{"city": "Paris"}',
    ]


def test_the_same_arguments_in_another_order_are_the_same_call() -> None:
    text = call("get_time", '{"zone": 3, "dst": true}') + call("get_time", '{"dst": true, "zone": 3}')
    out = ToolOutput(NAMES, required=False)
    assert out.feed("Checking. ") == "Checking. "
    feed_by_char(out, text)
    assert out.repeated
    assert len(out.finish()[1]) == 1


def test_text_that_is_no_call_is_left_to_the_parse_at_the_end() -> None:
    out = ToolOutput(NAMES, required=False)
    out.feed("<tool_call>\n[[[" + "}" * 5 + "not json}")
    assert not out.repeated
    assert out.finish()[1] == ()
