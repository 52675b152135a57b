"""Credentials shared by the server and the shim: the keys file of tenants and bearer-token matching."""
