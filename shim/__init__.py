"""Sluice's HTTP/SSE shim: FastAPI in front of the gRPC server, a client of clients/ over one channel.

app.py, families.py   create_app(): middleware order, error handlers, the API families it attaches,
                      and the registry that says whose a request is (its error shape, the API or not)
admission/            before routing: token, in-flight bound, body read within size and time limits
native/, openai/      the API families: routes, request models, serving, error shape, attach(app)
health/               the probes: /healthz, /readyz, /metrics
stream/               Generate streams for every family: paced reads, the one consumer, SSE
upstream/             the one channel, token forwarding, call options, disconnect cancellation
errors.py, refusals.py, proto_values.py, identity.py, jsonio.py, metrics.py, cors.py
                      what every family shares: one error model and code table, the shim's own
                      refusals, protobuf-bound field types, who a request is, JSON, instruments, CORS
config.py, serving.py, workers.py, connections.py, __main__.py
                      the process: settings, uvicorn on a bound socket, --workers, connection timers
"""
