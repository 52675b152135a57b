"""Model runtimes: the code that runs torch. Nothing in this package imports grpc or generated code."""
