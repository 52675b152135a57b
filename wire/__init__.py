"""The wire contract beyond the protos: every string that crosses a process boundary (metadata keys,
trailers, HTTP headers, health service names, error domains and reasons) and the clip rule for echoing a
caller's values. The server, the shim and the clients all import it, and it imports nothing of theirs;
the Node client keeps the same names in clients/node/wire.js, which a test checks against these."""
