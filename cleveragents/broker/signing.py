"""Message signing: Celery's ``auth`` serializer with JSON underneath (docs/security.md).

With ``CLEVERAGENTS_SIGNING_KEY``, ``CLEVERAGENTS_SIGNING_CERT`` and
``CLEVERAGENTS_SIGNING_CERT_STORE`` set (``settings.MessageSigning``), every task
message, and every remote-control message, carries the JSON body, the signer's
certificate id and an RSA-PSS signature of the body. A worker decodes a message
only when a certificate of its store verifies that signature. Results and task
events stay plain JSON: they are not signed.

kombu keeps one serializer registry per process, so a process signs with one
identity: a second, different one is a ``ConfigurationError`` rather than
messages silently signed with the other key.
"""

from __future__ import annotations

import binascii
from pathlib import Path
from typing import TYPE_CHECKING, Any

from celery.exceptions import SecurityError

from cleveragents.errors import ConfigurationError
from cleveragents.settings import MessageSigning

if TYPE_CHECKING:
    from celery import Celery

__all__ = [
    "DIGEST",
    "ENVELOPE_SEPARATOR",
    "SIGNED_BODY_CONTENT_TYPE",
    "SIGNED_CONTENT_TYPE",
    "SIGNED_SERIALIZER",
    "check_signing",
    "register_signing",
    "signed_body_content_type",
]

#: Celery's signing serializer (``task_serializer``), registered with kombu.
SIGNED_SERIALIZER = "auth"
#: The content type Celery's ``auth`` serializer gives a message (celery/security/serialization.py).
SIGNED_CONTENT_TYPE = "application/data"
#: What a signed message wraps: JSON, never pickle.
SIGNED_BODY_CONTENT_TYPE = "application/json"
#: What separates the fields of Celery's signed envelope (its ``DEFAULT_SEPARATOR``).
ENVELOPE_SEPARATOR = b"\x00\x01"
#: The digest signed with RSA-PSS (Celery's ``security_digest`` default).
DIGEST = "sha256"
#: What loading or checking a key or certificate raises (Celery wraps most as SecurityError).
_SECURITY_ERRORS = (SecurityError, ValueError, TypeError)
#: The signing identity registered in this process, once there is one.
_registered: dict[str, MessageSigning] = {}


def _read(path: Path, variable: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"{variable}: cannot read {path}: {exc}") from None


def check_signing(signing: MessageSigning) -> None:
    """Check that the key, the certificate and the store load and fit together.

    Raises:
        ConfigurationError: a file cannot be read or parsed, the certificate has
            expired, the store holds no certificate or not this one, or the key is
            not the certificate's.
    """
    from celery.security.certificate import Certificate, FSCertStore
    from celery.security.key import PrivateKey
    from celery.security.utils import get_digest_algorithm

    key = _load(PrivateKey, signing.key, "CLEVERAGENTS_SIGNING_KEY")
    cert = _load(Certificate, signing.certificate, "CLEVERAGENTS_SIGNING_CERT")
    if cert.has_expired():
        raise ConfigurationError(f"CLEVERAGENTS_SIGNING_CERT ({signing.certificate}) has expired")
    store = _store(signing, FSCertStore)
    try:
        trusted = store[cert.get_id()]
    except _SECURITY_ERRORS:
        raise ConfigurationError(
            f"CLEVERAGENTS_SIGNING_CERT_STORE ({signing.cert_store}) does not hold "
            f"CLEVERAGENTS_SIGNING_CERT ({signing.certificate}): the store holds every "
            "signer's certificate, this process's own included"
        ) from None
    digest = get_digest_algorithm(DIGEST)
    probe = b"cleveragents: does this key sign for this certificate?"
    try:
        trusted.verify(probe, key.sign(probe, digest), digest)
    except _SECURITY_ERRORS:
        raise ConfigurationError(
            f"CLEVERAGENTS_SIGNING_KEY ({signing.key}) is not the key of the certificate "
            f"CLEVERAGENTS_SIGNING_CERT ({signing.certificate})"
        ) from None


def _load(kind: Any, path: Path, variable: str) -> Any:
    text = _read(path, variable)
    try:
        return kind(text)
    except _SECURITY_ERRORS as exc:  # not PEM, not RSA, encrypted (a TypeError), ...
        raise ConfigurationError(f"{variable} ({path}): {exc}") from None


def _store(signing: MessageSigning, store_class: Any) -> Any:
    try:
        store = store_class(signing.cert_store)
    except (OSError, *_SECURITY_ERRORS) as exc:  # unreadable, not a certificate, expired
        raise ConfigurationError(
            f"CLEVERAGENTS_SIGNING_CERT_STORE ({signing.cert_store}): {exc}"
        ) from None
    if not any(True for _ in store.itercerts()):
        raise ConfigurationError(
            f"CLEVERAGENTS_SIGNING_CERT_STORE ({signing.cert_store}) holds no certificate "
            "(give a folder of PEM certificates, one PEM file, or a glob)"
        )
    return store


def register_signing(signing: MessageSigning, *, app: Celery | None = None) -> None:
    """Sign and verify task messages with ``signing`` in this process.

    With ``app`` (the worker app: a worker, Flower, ``celery inspect``) this is
    Celery's ``app.setup_security``, which also makes ``auth`` kombu's default
    serializer and disables every decoder but JSON, process-wide. Without (a
    producer, perhaps a library in someone else's process) only Celery's ``auth``
    serializer is registered, and the process's other kombu users are left as
    they were.

    Raises:
        ConfigurationError: ``signing`` does not load (``check_signing``), or this
            process already signs with another identity.
    """
    from celery.security.serialization import register_auth

    check_signing(signing)
    current = _registered.get("identity")
    if current is not None and current != signing:
        raise ConfigurationError(
            f"this process already signs with {current.key}; kombu's serializer registry "
            "holds one signing identity per process"
        )
    _registered["identity"] = signing
    if app is not None:
        app.setup_security(allowed_serializers={"json"}, serializer="json", digest=DIGEST)
        return
    register_auth(
        _read(signing.key, "CLEVERAGENTS_SIGNING_KEY"),
        None,
        _read(signing.certificate, "CLEVERAGENTS_SIGNING_CERT"),
        signing.cert_store,
        DIGEST,
        "json",
    )


def signed_body_content_type(body: Any) -> str | None:
    """The content type of the body a signed message wraps, read without verifying it.

    None when ``body`` is not Celery's signed envelope. Read the way Celery's
    ``SecureSerializer._unpack`` reads it, so that both see the same fields.
    """
    from celery.utils.serialization import b64decode

    if not isinstance(body, bytes | str):
        return None
    try:
        fields = b64decode(body.encode() if isinstance(body, str) else body)
    except (binascii.Error, ValueError):
        return None
    parts = fields.split(ENVELOPE_SEPARATOR, 4)
    if len(parts) != 5:
        return None
    return parts[2].decode("utf-8", "replace")
