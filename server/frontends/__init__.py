"""gRPC front-end processes sharing one port, and the engine side that serves their calls."""
