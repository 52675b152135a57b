"""Reading serialized messages without parsing them: the top-level fields of a request (so admission can
find the model a call names before its tensors are decoded) and the path of the first invalid UTF-8 string
(protobuf refuses proto3 `string` fields holding invalid UTF-8 with a bare DecodeError; the walker names the
field for BadRequest).

Every function here reads hostile bytes: malformed or truncated input yields None, never an exception.
"""

from __future__ import annotations

from collections.abc import Iterator

from google.protobuf.descriptor import Descriptor, FieldDescriptor

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


class _Malformed(Exception):
    """The bytes are not a well-formed message; callers turn this into None."""


def last_string_field(data: bytes, number: int) -> str | None:
    """The value of top-level string field `number` as protobuf would read it (the last occurrence wins),
    "" when absent, None when the bytes are malformed or the value is not UTF-8. Reads field headers only:
    length-delimited values are skipped, not copied. It runs for every guarded call, so it is `_fields` and
    `_varint` written out in one loop (their generator and calls were 8 Python calls per Infer)."""
    found_start = found_end = -1
    pos, end = 0, len(data)
    while pos < end:
        key = shift = 0
        while True:  # the field's key, a varint
            if shift >= 64 or pos >= end:
                return None
            byte = data[pos]
            pos += 1
            key |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
        wire_type = key & 7
        start = pos
        if wire_type in (_LENGTH, _VARINT):
            value = shift = 0
            while True:  # the length, or the value skipped
                if shift >= 64 or pos >= end:
                    return None
                byte = data[pos]
                pos += 1
                value |= (byte & 0x7F) << shift
                if not byte & 0x80:
                    break
                shift += 7
            if wire_type == _LENGTH:
                start = pos
                pos += value
        elif wire_type == _FIXED64:
            pos += 8
        elif wire_type == _FIXED32:
            pos += 4
        else:  # groups (3, 4) are not proto3; anything else is not a message at all
            return None
        if pos > end or key >> 3 == 0:
            return None
        if key >> 3 == number and wire_type == _LENGTH:
            found_start, found_end = start, pos
    if found_start < 0:
        return ""
    try:
        return data[found_start:found_end].decode("utf-8")
    except UnicodeDecodeError:
        return None


def find_invalid_utf8(descriptor: Descriptor, data: bytes, prefix: str = "") -> str | None:
    """The path of the first string field (e.g. `sampling.stop[1]`) whose bytes are not UTF-8, or None."""
    try:
        return _find_invalid_utf8(descriptor, memoryview(data), 0, len(data), prefix)
    except _Malformed:
        return None


def _find_invalid_utf8(
    descriptor: Descriptor, view: memoryview, pos: int, end: int, prefix: str
) -> str | None:
    counts: dict[str, int] = {}
    for number, wire_type, start, stop in _fields(view, pos, end):
        field = descriptor.fields_by_number.get(number)
        if wire_type != _LENGTH or field is None:
            continue
        path = prefix + field.name
        if _is_repeated(field):
            index = counts.get(field.name, 0)
            counts[field.name] = index + 1
            path = f"{path}[{index}]"
        if field.type == FieldDescriptor.TYPE_STRING:
            try:
                bytes(view[start:stop]).decode("utf-8")
            except UnicodeDecodeError:
                return path
        elif field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type is not None:
            if field.message_type.GetOptions().map_entry:
                path = prefix + field.name
            found = _find_invalid_utf8(field.message_type, view, start, stop, path + ".")
            if found:
                return found
    return None


def _fields(view: memoryview, pos: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, value start, value end) for each field in view[pos:end]."""
    while pos < end:
        key, pos = _varint(view, pos, end)
        number, wire_type = key >> 3, key & 7
        start = pos
        if wire_type == _VARINT:
            _, pos = _varint(view, pos, end)
        elif wire_type == _FIXED64:
            pos += 8
        elif wire_type == _FIXED32:
            pos += 4
        elif wire_type == _LENGTH:
            length, start = _varint(view, pos, end)
            pos = start + length
        else:  # groups (3, 4) are not proto3; anything else is not a message at all
            raise _Malformed
        if pos > end or number == 0:
            raise _Malformed
        yield number, wire_type, start, pos


def _is_repeated(field: FieldDescriptor) -> bool:
    is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
    return bool(field.is_repeated) and not is_map


def _varint(view: memoryview, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while shift < 64:
        if pos >= end:
            raise _Malformed
        byte = view[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
    raise _Malformed
