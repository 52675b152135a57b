"""An OTLP/gRPC trace endpoint for benchmarks, in a process of its own: it answers every export with an empty
ExportTraceServiceResponse (zero bytes) without parsing it, so that a collector's own work is not counted
against the service measured, and prints `EXPORT <bytes>` per export.

    python -m bench.otlp_sink      # prints `otlp sink listening on PORT`; SIGTERM stops it
"""

from __future__ import annotations

import signal
from concurrent import futures
from typing import Any

import grpc

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


def main() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))

    def export(raw: bytes, context: Any) -> bytes:
        print(f"EXPORT {len(raw)}", flush=True)
        return b""

    handler = grpc.unary_unary_rpc_method_handler(export)  # no (de)serializers: bytes in, bytes out
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Export": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    signal.signal(signal.SIGTERM, lambda *_: server.stop(grace=None))
    print(f"otlp sink listening on {port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
