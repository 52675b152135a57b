"""The shim's side of its calls to the server: the one pooled channel (channel) with the token-forwarding
interceptors (forwarding), what an HTTP request asks of its call (call_options), and the cancelling of a
unary call whose HTTP client left (disconnect)."""
