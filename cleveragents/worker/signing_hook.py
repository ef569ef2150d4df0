"""Message signing in every process of the worker app: a worker, Flower, ``celery inspect``.

Celery signs remote control with the task serializer too, so Flower's and
``celery inspect``'s broadcasts are signed, and the workers' replies verified, like
task messages. The worker app therefore turns signing on when its configuration is
first read, in whichever process that is (``worker/__init__.py`` connects it);
importing this module does nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cleveragents.broker.signing import SIGNED_SERIALIZER, register_signing
from cleveragents.errors import ConfigurationError
from cleveragents.settings import MessageSigning

__all__ = ["sign_when_configured"]


def sign_when_configured(sender: Any, **_: Any) -> None:
    """``app.on_after_configure`` receiver: Celery's ``setup_security`` when signing is on."""
    conf = sender.conf
    if conf.task_serializer != SIGNED_SERIALIZER:
        return
    signing = MessageSigning(
        Path(conf.security_key), Path(conf.security_certificate), conf.security_cert_store
    )
    try:
        register_signing(signing, app=sender)
    except ConfigurationError as exc:
        # Celery logs and ignores a receiver's exception; a process that cannot sign
        # (or verify) must not run. One line, as celeryconfig does for a bad setting.
        raise SystemExit(f"error: {exc}") from None
