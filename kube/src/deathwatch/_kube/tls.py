"""The serving certificate of a metrics port: from a directory (`tls.crt`, `tls.key`: a
cert-manager Certificate's Secret, mounted), or made at start and signed by itself, as
controller-runtime's metrics server does when it is given none.

A self-signed certificate proves nothing about who serves it (Prometheus scrapes it with
`insecure_skip_verify`); it keeps the token a scraper sends from being read on the way,
which is what matters here: the token is what grants reading. A mounted one (cert-manager's,
or the chart's own CA's: ADR 0043) is verified by the scraper. A mounted one is read again
when its files change (`Serving.refresh`, called on a period), as cert-manager renews it.
"""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

CERT, KEY = "tls.crt", "tls.key"


class CertificateError(Exception):
    """The serving certificate cannot be used: which file, and why."""


def self_signed(names: Sequence[str], timeout: float = 60.0) -> tuple[bytes, bytes]:
    """A new P-256 key and a certificate for `names` signed by it, as PEM: (certificate, key),
    made by a child interpreter (selfsigned.py). The cryptography package it needs is 7.5 MiB
    and 51 modules resident for the life of a process that uses it once: every controller
    replica and every node's agent (bench/idle_memory.py)."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "deathwatch._kube.selfsigned", *names],
            capture_output=True, timeout=timeout, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CertificateError(f"cannot make the self-signed serving certificate: {exc}") from None
    if done.returncode != 0:
        said = (done.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise CertificateError(
            f"cannot make the self-signed serving certificate (exit {done.returncode}): {said}"
        )
    cert, _, key = done.stdout.partition(b"-----BEGIN PRIVATE KEY-----")
    if not cert.startswith(b"-----BEGIN CERTIFICATE-----") or not key:
        raise CertificateError("cannot make the self-signed serving certificate: no PEM came back")
    return cert, b"-----BEGIN PRIVATE KEY-----" + key


@dataclass
class Serving:
    """The TLS context of one listener; `directory` None: self-signed for `names`."""

    directory: Path | None
    names: Sequence[str] = ()
    context: ssl.SSLContext = field(init=False)
    # when the certificate in force expires (unix time; None: it could not be read): a
    # metric, so that one nothing renews is said before scrapers refuse it
    not_after: float | None = field(init=False, default=None)
    _stamp: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.directory is None:
            cert, key = self_signed(self.names)
            self.not_after = _load_pem(self.context, cert, key)
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
        self.not_after = expiry(cert)
        return True


def expiry(cert: Path) -> float | None:
    """When the PEM certificate at `cert` expires (unix time), or None if it cannot be read.
    CPython's own decoder (what its ssl tests use), not the cryptography package, for the
    same reason `self_signed` runs in a child: its 7.5 MiB for one date."""
    decode = getattr(ssl._ssl, "_test_decode_cert", None)  # type: ignore[attr-defined]
    if decode is None:
        return None
    try:
        return float(ssl.cert_time_to_seconds(decode(str(cert))["notAfter"]))
    except Exception:  # an interpreter without it, or a file it cannot read: said as None
        return None


def _load_pem(context: ssl.SSLContext, cert: bytes, key: bytes) -> float | None:
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
            return expiry(cert_path)
    except OSError as exc:
        raise CertificateError(
            f"cannot stage the serving certificate in {tempfile.gettempdir()}: "
            f"{exc.strerror or exc} (mount a writable /tmp, or give a certificate directory)"
        ) from exc
