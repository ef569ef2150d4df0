"""``cleveragents approvals serve``: the inbox over HTTP, until a signal stops it.

The server holds one ``SkillClient`` for its life: its desk decides with this
process's Redis user (the ``approver``), as the CLI does. uvicorn's access log is
off (``AccessLog`` writes method, path and status only), and proxy headers are not
read: a client cannot choose the address it is logged under.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

from cleveragents.client import SkillClient
from cleveragents.inbox.access import TOKEN_ENV, check_inbox_options
from cleveragents.inbox.app import InboxConfig, build_app
from cleveragents.settings import Settings
from cleveragents.stores.factory import audit_secret

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "InboxOptions", "serve_inbox"]

log = logging.getLogger("cleveragents.inbox")

#: Defaults of ``cleveragents approvals serve``.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8766


@dataclass(frozen=True)
class InboxOptions:
    """Where the inbox listens, and its token (``CLEVERAGENTS_APPROVALS_TOKEN``)."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    token: str | None = field(default=None, repr=False)


def _log_to_stderr() -> None:
    logger = logging.getLogger("cleveragents.inbox")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("cleveragents inbox: %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def serve_inbox(options: InboxOptions, settings: Settings) -> None:
    """Serve the approvals inbox until SIGINT or SIGTERM.

    Raises:
        ConfigurationError: a host beyond loopback without a token.
    """
    import uvicorn  # only this command needs it

    check_inbox_options(options.host, options.token)
    _log_to_stderr()
    with SkillClient(settings=settings) as client:
        config = InboxConfig(
            desk=client.approvals,
            audit_key=audit_secret(settings),
            token=options.token,
            host=options.host,
            public_url=settings.approvals_url,
        )
        app = build_app(config)
        if not options.token:
            log.warning("%s is not set: anyone on this machine may decide (loopback only)",
                        TOKEN_ENV)
        shown = settings.approvals_url or f"http://{options.host}:{options.port}/"
        log.info("the approvals inbox is at %s", shown)
        server = uvicorn.Server(uvicorn.Config(
            app, host=options.host, port=options.port, log_level="warning",
            access_log=False, proxy_headers=False, lifespan="off",
        ))
        server.run()
