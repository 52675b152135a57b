"""Locates invalid UTF-8 in a serialized message, so a parse failure can name the field (BadRequest).

protobuf refuses proto3 `string` fields holding invalid UTF-8 with a bare DecodeError; this walker reads the
wire format against the message descriptor and returns the path of the first such field.
"""

from __future__ import annotations

from google.protobuf.descriptor import Descriptor, FieldDescriptor


def find_invalid_utf8(descriptor: Descriptor, data: bytes, prefix: str = "") -> str | None:
    counts: dict[str, int] = {}
    pos, end = 0, len(data)
    while pos < end:
        key, pos = _varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            _, pos = _varint(data, pos)
            continue
        if wire_type == 1:
            pos += 8
            continue
        if wire_type == 5:
            pos += 4
            continue
        if wire_type != 2:
            return None
        length, pos = _varint(data, pos)
        chunk, pos = data[pos : pos + length], pos + length
        field = descriptor.fields_by_number.get(number)
        if field is None:
            continue
        path = prefix + field.name
        if _is_repeated(field):
            index = counts.get(field.name, 0)
            counts[field.name] = index + 1
            path = f"{path}[{index}]"
        if field.type == FieldDescriptor.TYPE_STRING:
            try:
                chunk.decode("utf-8")
            except UnicodeDecodeError:
                return path
        elif field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type is not None:
            if field.message_type.GetOptions().map_entry:
                path = prefix + field.name
            found = find_invalid_utf8(field.message_type, chunk, path + ".")
            if found:
                return found
    return None


def _is_repeated(field: FieldDescriptor) -> bool:
    is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
    return bool(field.is_repeated) and not is_map


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
