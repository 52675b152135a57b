"""Prints tritonclient's own generated descriptors of the v2 protocol (service_pb2, model_config_pb2), as
JSON: every message's fields (name -> number, type, repeated, type name) and the service's methods. Run in
.venv-triton; the reference copy the protocol test checks Sluice's messages against."""

from __future__ import annotations

import json
from typing import Any


def _messages(descriptor: Any, out: dict[str, Any]) -> None:
    for message in descriptor.message_types_by_name.values():
        _message(message, out)


def _message(message: Any, out: dict[str, Any]) -> None:
    out[message.full_name] = {
        field.name: [
            field.number,
            field.type,
            field.label == field.LABEL_REPEATED,
            field.message_type.full_name if field.message_type else "",
        ]
        for field in message.fields
    }
    for nested in message.nested_types:
        _message(nested, out)


def main() -> None:
    from tritonclient.grpc import model_config_pb2, service_pb2

    messages: dict[str, Any] = {}
    _messages(service_pb2.DESCRIPTOR, messages)
    _messages(model_config_pb2.DESCRIPTOR, messages)
    service = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    methods = {
        m.name: [m.input_type.full_name, m.output_type.full_name, m.client_streaming, m.server_streaming]
        for m in service.methods
    }
    enums = {v.name: v.number for v in model_config_pb2.DESCRIPTOR.enum_types_by_name["DataType"].values}
    print(json.dumps({"messages": messages, "methods": methods, "data_types": enums}))


if __name__ == "__main__":
    main()
