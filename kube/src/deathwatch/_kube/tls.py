"""The serving certificate of a metrics port: from a directory (`tls.crt`, `tls.key`: a
cert-manager Certificate's Secret, mounted), or made at start and signed by itself, as
controller-runtime's metrics server does when it is given none.

A self-signed certificate proves nothing about who serves it (Prometheus scrapes it with
`insecure_skip_verify`); it keeps the token a scraper sends from being read on the way,
which is what matters here: the token is what grants reading. A mounted one is read again
when its files change (`Serving.refresh`, called on a period), as cert-manager renews it.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

CERT, KEY = "tls.crt", "tls.key"


class CertificateError(Exception):
    """The serving certificate cannot be used: which file, and why."""


def self_signed(names: Sequence[str], days: int = 365) -> tuple[bytes, bytes]:
    """A new P-256 key and a certificate for `names` (DNS names or IP addresses) signed by
    it, as PEM: (certificate, key)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0] if names else "x")])
    alt: list[x509.GeneralName] = []
    for name in names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt.append(x509.DNSName(name))
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


@dataclass
class Serving:
    """The TLS context of one listener; `directory` None: self-signed for `names`."""

    directory: Path | None
    names: Sequence[str] = ()
    context: ssl.SSLContext = field(init=False)
    _stamp: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.directory is None:
            cert, key = self_signed(self.names)
            _load_pem(self.context, cert, key)
        else:
            self.refresh()

    def refresh(self) -> bool:
        """Load the mounted files again if they changed; True when they were. Raises
        CertificateError when they cannot be used (the last good ones stay in force)."""
        if self.directory is None:
            return False
        cert, key = self.directory / CERT, self.directory / KEY
        try:
            stamp = (cert.stat().st_mtime, key.stat().st_mtime)
        except OSError as exc:
            raise CertificateError(f"{exc.filename}: {exc.strerror}") from None
        if stamp == self._stamp:
            return False
        try:
            self.context.load_cert_chain(cert, key)
        except (ssl.SSLError, OSError) as exc:
            raise CertificateError(f"{cert}, {key}: {exc}") from None
        self._stamp = stamp
        return True


def _load_pem(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """ssl loads a chain from files only: written to a private directory, loaded, removed.
    A read-only root filesystem needs a writable temporary directory (the charts mount an
    in-memory /tmp): said as a CertificateError naming it, not an OSError traceback."""
    try:
        with tempfile.TemporaryDirectory(prefix="deathwatch-tls-") as tmp:
            os.chmod(tmp, 0o700)
            cert_path, key_path = Path(tmp) / CERT, Path(tmp) / KEY
            cert_path.write_bytes(cert)
            key_path.touch(0o600)
            key_path.write_bytes(key)
            context.load_cert_chain(cert_path, key_path)
    except OSError as exc:
        raise CertificateError(
            f"cannot stage the serving certificate in {tempfile.gettempdir()}: "
            f"{exc.strerror or exc} (mount a writable /tmp, or give a certificate directory)"
        ) from exc
