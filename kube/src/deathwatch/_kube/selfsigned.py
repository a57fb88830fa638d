"""A self-signed serving certificate, made in a child interpreter of its own:
`python -m deathwatch._kube.selfsigned NAME...` prints the certificate, then its key, as PEM.
tls.self_signed runs it, so the long-lived process never loads the cryptography package."""

from __future__ import annotations

import datetime
import ipaddress
import sys
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def make(names: Sequence[str], days: int = 365) -> tuple[bytes, bytes]:
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


if __name__ == "__main__":
    certificate, key = make(sys.argv[1:])
    sys.stdout.buffer.write(certificate + key)
