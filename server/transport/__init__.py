"""How the gRPC port is served, by the one process or by each front end: its options (message limits,
connections, streams per connection, lifetimes), TLS and mTLS, and reflection."""
