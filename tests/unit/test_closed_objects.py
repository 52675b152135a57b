"""Closed objects (issue 34 item 5): the default Sluice adds to a JSON schema reaches every subschema that
lists properties, leaves a stated `additionalProperties` as the caller wrote it, and never touches data
(const, enum, default) or a property that happens to be called `properties`."""

from __future__ import annotations

from server.closed_objects import close_objects


def test_every_object_that_lists_properties_is_closed_and_nothing_else_changes() -> None:
    item = {"type": "object", "properties": {"n": {"type": "integer"}}}
    schema = {
        "type": "object",
        "properties": {
            "properties": {"type": "object", "properties": {"x": {"type": "string"}}},
            "open": {"type": "object", "properties": {}, "additionalProperties": True},
            "list": {"type": "array", "items": {"$ref": "#/$defs/item"}},
            "either": {"anyOf": [{"type": "object", "properties": {"a": {}}}, {"type": "null"}]},
            "data": {"const": {"properties": {"k": 1}}, "default": {"properties": {}}},
        },
        "$defs": {"item": item},
        "additionalProperties": {"type": "object", "properties": {"y": {}}},
    }
    closed = close_objects(schema)
    props = closed["properties"]
    assert closed["additionalProperties"]["additionalProperties"] is False
    assert "additionalProperties" not in props  # the map of properties is no schema
    assert props["properties"]["additionalProperties"] is False
    assert props["open"]["additionalProperties"] is True
    assert closed["$defs"]["item"]["additionalProperties"] is False
    assert props["either"]["anyOf"][0]["additionalProperties"] is False
    assert props["data"] == {"const": {"properties": {"k": 1}}, "default": {"properties": {}}}
    assert close_objects({"type": "object"}) == {"type": "object"}  # any object stays any object
    assert close_objects(True) is True


def test_a_deep_schema_costs_no_recursion() -> None:
    schema: dict[str, object] = {"type": "object", "properties": {}}
    node = schema
    for _ in range(5000):
        child: dict[str, object] = {"type": "object", "properties": {}}
        node["properties"] = {"c": child}
        node = child
    close_objects(schema)
    assert node["additionalProperties"] is False
