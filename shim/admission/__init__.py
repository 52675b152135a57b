"""What happens to an API request before routing: its token checked on the headers (auth), a slot of the
shim's in-flight bound (bound), its body read within size and time limits (request_body), all in one ASGI
middleware (middleware) that refuses in the shape of the API family the request is for."""
