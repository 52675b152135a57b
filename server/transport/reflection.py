"""gRPC server reflection under both names that tools ask for: `grpc.reflection.v1` (current grpcurl asks
for it first) and `grpc.reflection.v1alpha`. grpcio-reflection ships v1alpha only; v1's messages are the
same on the wire, so one servicer answers both, and v1's file descriptor is v1alpha's with the package
renamed, so that v1 itself can be described."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha._async import ReflectionServicer

V1_SERVICE = "grpc.reflection.v1.ServerReflection"
V1ALPHA_SERVICE = reflection.SERVICE_NAME
_V1ALPHA_PREFIX = ".grpc.reflection.v1alpha."


def _v1_file() -> bytes:
    file = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(file)
    file.name = "grpc/reflection/v1/reflection.proto"
    file.package = "grpc.reflection.v1"

    def renamed(type_name: str) -> str:
        return type_name.replace(_V1ALPHA_PREFIX, ".grpc.reflection.v1.", 1)

    for message in file.message_type:
        for field in message.field:
            if field.type_name:
                field.type_name = renamed(field.type_name)
    for service in file.service:
        for method in service.method:
            method.input_type = renamed(method.input_type)
            method.output_type = renamed(method.output_type)
    return file.SerializeToString()


def enable_reflection(server: grpc.aio.Server, services: Sequence[str]) -> None:
    """Serves reflection for `services` and for both reflection services themselves."""
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName("grpc/reflection/v1/reflection.proto")
    except KeyError:
        pool.AddSerializedFile(_v1_file())
    servicer = ReflectionServicer([*services, V1_SERVICE, V1ALPHA_SERVICE])
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    v1 = grpc.method_handlers_generic_handler(
        V1_SERVICE,
        {
            "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
                servicer.ServerReflectionInfo,
                request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
                response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((v1,))
