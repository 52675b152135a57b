"""TLS on the gRPC port: the server's certificate and key, and for mTLS the CA its clients' certificates
must chain to. The files are read again whenever they change on disk (checked as each new connection
starts its handshake), so a certificate is rotated by replacing the files: connections already open keep
theirs, new ones get the new one, and no call fails. A pair that does not load (a half-written rotation,
a key that does not match) is ignored until it does, and the last good one stays in use."""

from __future__ import annotations

import ipaddress
import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # grpc loads with the server, not with the flags (config.py builds TlsFiles)
    import grpc

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert: Path
    key: Path
    client_ca: Path | None = None

    def check(self) -> None:
        """Raises ValueError naming the setting where the files cannot serve (before anything binds)."""
        for name, path in (("tls_cert", self.cert), ("tls_key", self.key), ("tls_client_ca", self.client_ca)):
            if path is not None and not os.access(path, os.R_OK):
                raise ValueError(f"invalid setting {name}: cannot read {path}")
        try:
            _load(self)
        except (ssl.SSLError, ValueError) as exc:
            raise ValueError(
                f"invalid setting tls_cert: {self.cert} and {self.key} are not a PEM certificate and its key "
                f"({exc})"
            ) from exc

    def stamp(self) -> tuple[tuple[int, int], ...]:
        paths = [self.cert, self.key, *([self.client_ca] if self.client_ca else [])]
        stats = [p.stat() for p in paths]
        return tuple((s.st_mtime_ns, s.st_size) for s in stats)


def server_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """Credentials that reload `files` when they change; clients must present a certificate signed by
    `files.client_ca` where it is set (mTLS)."""
    import grpc

    reloader = _Reloader(files)
    return grpc.dynamic_ssl_server_credentials(
        reloader.current,
        reloader.fetch,  # type: ignore[arg-type]  # the stubs miss that None keeps the current one
        require_client_authentication=files.client_ca is not None,
    )


class _Reloader:
    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self.stamp = files.stamp()
        self.current = _load(files)
        self.failed_stamp: tuple[tuple[int, int], ...] | None = None

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """Called by gRPC before each new handshake: a new configuration when the files changed, else None
        (keep the current one). Never raises: a failure here would fail the handshake."""
        try:
            stamp = self.files.stamp()
            if stamp == self.stamp or stamp == self.failed_stamp:
                return None
            config = _load(self.files)
        except (OSError, ssl.SSLError, ValueError) as exc:
            if stamp != self.failed_stamp:  # once per change, not once per connection
                log.warning("TLS files changed but do not load (%s); keeping the previous certificate", exc)
            self.failed_stamp = stamp
            return None
        self.stamp, self.current = stamp, config
        log.info("TLS certificate reloaded from %s", self.files.cert)
        return config


def _load(files: TlsFiles) -> grpc.ServerCertificateConfiguration:
    import grpc

    cert, key = files.cert.read_bytes(), files.key.read_bytes()
    # gRPC would accept a mismatched pair and fail every handshake; Python's ssl checks that they match.
    ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(files.cert, files.key)
    ca = files.client_ca.read_bytes() if files.client_ca else None
    return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)


def is_loopback(host: str) -> bool:
    """Whether `host` only listens on this machine (where plaintext is the default and fine)."""
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
