"""A certificate authority the multi-host rig makes for itself, and the one server
certificate it signs (every rig host by name and address), for ``rediss://`` and
``amqps://`` between hosts."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

#: How long the rig's certificates are valid: a soak's length, with room.
VALID_FOR = datetime.timedelta(days=2)


@dataclass(frozen=True)
class RigCA:
    """The files of the rig's CA and its server certificate (PEM)."""

    ca: Path
    cert: Path
    key: Path


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = ec.generate_private_key(ec.SECP256R1())
    path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    ))
    path.chmod(0o644)  # read by redis-server and RabbitMQ, which run as root here too
    return key


def _builder(
    subject: str, issuer: str, public: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALID_FOR)
    )


def make_ca(folder: Path, names: list[str], addresses: list[str]) -> RigCA:
    """A new CA in ``folder``, and a server certificate for ``names`` and ``addresses``."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = _key(folder / "ca.key")
    ca_cert = (
        _builder("cleveragents rig CA", "cleveragents rig CA", ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = _key(folder / "server.key")
    alt: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    alt += [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]
    cert = (
        _builder("cleveragents rig", "cleveragents rig CA", key.public_key())
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    (folder / "ca.pem").write_bytes(ca_cert.public_bytes(pem))
    (folder / "server.pem").write_bytes(cert.public_bytes(pem))
    return RigCA(folder / "ca.pem", folder / "server.pem", folder / "server.key")
