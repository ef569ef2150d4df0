"""Settings read from the environment, in one place (SPEC section 7)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cleveragents.errors import ConfigurationError

__all__ = [
    "BACKEND_FORMS",
    "BROKER_FORMS",
    "SENTINEL_REPLICA_WAIT_MS",
    "SENTINEL_SCHEMES",
    "SIGNING_VARIABLES",
    "MessageSigning",
    "Settings",
    "bundled_examples_path",
    "shown_url",
    "tool_kind_modules",
]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def bundled_examples_path() -> Path:
    """The example catalogue shipped with the package."""
    from cleveragents import examples  # the bundled examples (the examples/ folder)

    return Path(examples.__file__).resolve().parent


#: The forms a broker URL takes, as a mistaken one is told.
BROKER_FORMS = (
    "redis://[user:password@]host:6379/0, rediss://... (TLS), "
    "sentinel://[:password@]host:26379;sentinel://host2:26379;... (Redis Sentinel), "
    "or amqp://user:password@host:5672/vhost (RabbitMQ)"
)
BACKEND_FORMS = (
    "redis://[user:password@]host:6379/0, rediss://... (TLS) "
    "or sentinel://[:password@]host:26379;sentinel://host2:26379;... (Redis Sentinel)"
)
#: URL schemes of a Redis found through Sentinel (Celery's and kombu's form).
SENTINEL_SCHEMES = ("sentinel",)
#: The replica acknowledgement a decisive write waits for on a Sentinel fleet, in
#: milliseconds, when CLEVERAGENTS_REPLICA_WAIT_MS is not set (``replica_wait_ms``).
SENTINEL_REPLICA_WAIT_MS = 100
_PASSWORD = re.compile(r"(?<=:)[^:@/]*(?=@)")


def _check_url(name: str, url: str | None, *, broker: bool) -> None:
    """A URL without a scheme is refused here in one line naming the setting and the
    forms it takes (not a raw ``OperationalError`` from a host name like
    ``redis//host``); a scheme no broker speaks is refused as the app is configured
    (``cleveragents/broker/celery_settings.py``, which knows kombu's and Celery's)."""
    if url is None:
        return
    scheme, sep, _ = url.partition("://")
    if not sep or not scheme:
        forms = BROKER_FORMS if broker else BACKEND_FORMS
        raise ConfigurationError(
            f"{name}={shown_url(url)} is not a URL (no scheme://): it takes the form {forms}"
        )


def shown_url(url: str) -> str:
    """``url`` with any password masked, for a message."""
    return _PASSWORD.sub("**", url)


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigurationError(f"{name} must be 1 or 0, got {raw!r}")


def _positive_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigurationError(f"{name} must be a number of seconds, got {raw!r}") from None
    if value <= 0:
        raise ConfigurationError(f"{name} must be positive, got {raw!r}")
    return value


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip().replace("_", ""))
    except ValueError:
        raise ConfigurationError(f"{name} must be a whole number, got {raw!r}") from None
    if value <= 0:
        raise ConfigurationError(f"{name} must be positive, got {raw!r}")
    return value


def _replication(env: Mapping[str, str]) -> dict[str, Any]:
    """The settings of a replicated Redis: Sentinel's primary name, the replica wait."""
    master = (env.get("CLEVERAGENTS_SENTINEL_MASTER") or "").strip() or "mymaster"
    raw = (env.get("CLEVERAGENTS_REPLICA_WAIT_MS") or "").strip()
    if not raw:
        return {"sentinel_master": master}
    try:
        wait_ms = int(raw)
    except ValueError:
        raise ConfigurationError(
            f"CLEVERAGENTS_REPLICA_WAIT_MS must be a whole number of milliseconds, got {raw!r}"
        ) from None
    if wait_ms < 0:
        raise ConfigurationError(f"CLEVERAGENTS_REPLICA_WAIT_MS must be 0 or more, got {raw!r}")
    return {"sentinel_master": master, "replica_wait_ms_given": wait_ms}


def tool_kind_modules(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """CLEVERAGENTS_TOOL_KINDS: module names separated by ``os.pathsep`` or commas."""
    raw = (os.environ if env is None else env).get("CLEVERAGENTS_TOOL_KINDS") or ""
    return tuple(p.strip() for p in re.split(f"[{re.escape(os.pathsep)},]", raw) if p.strip())


#: Message signing's settings: this process's key, its certificate, the trusted certificates.
SIGNING_VARIABLES = (
    "CLEVERAGENTS_SIGNING_KEY",
    "CLEVERAGENTS_SIGNING_CERT",
    "CLEVERAGENTS_SIGNING_CERT_STORE",
)


@dataclass(frozen=True)
class MessageSigning:
    """Where this process's signing key, its certificate and the trusted certificates are.

    The store is a folder holding only PEM certificates, one PEM file, or a glob
    (Celery's ``security_cert_store``); it holds every signer's certificate.
    """

    key: Path
    certificate: Path
    cert_store: str

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> MessageSigning | None:
        """The three signing variables of ``env``, or None when none is set.

        Raises:
            ConfigurationError: only some of them are set.
        """
        values = [(env.get(name) or "").strip() for name in SIGNING_VARIABLES]
        if not any(values):
            return None
        missing = [name for name, value in zip(SIGNING_VARIABLES, values, strict=True) if not value]
        if missing:
            raise ConfigurationError(
                f"message signing needs all of {', '.join(SIGNING_VARIABLES)}; "
                f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set"
            )
        key, certificate, store = values
        store = os.path.expanduser(store)  # a folder, a file or a glob
        return cls(Path(key).expanduser(), Path(certificate).expanduser(), store)


@dataclass(frozen=True)
class Settings:
    """Every setting the library reads from the environment."""

    broker_url: str | None
    result_backend: str | None
    catalogue_paths: tuple[str, ...]
    read_only: bool
    home: Path
    default_timeout_s: float
    log_format: str
    visibility_timeout_s: float = 900.0
    #: Redis: a dead worker's invocations are handed out again within this many seconds.
    recovery_s: float = 30.0
    result_expires_s: float = 7 * 24 * 3600.0
    #: Modules that register tool kinds, imported before the catalogue loads.
    tool_kinds: tuple[str, ...] = ()
    #: Whether broadcast commands that change a worker (shutdown, pool_restart,
    #: add_consumer, ...) are obeyed; inspection and events always work.
    remote_control: bool = False
    #: No invocation's timeout goes past this, whatever the request asks.
    max_timeout_s: float = 3600.0
    #: Sign task messages and accept only signed ones (docs/security.md); None: plain JSON.
    signing: MessageSigning | None = None
    #: The bearer token of `cleveragents mcp serve --transport http` (docs/mcp.md).
    mcp_token: str | None = field(default=None, repr=False)
    #: Larger tool output (a command's stdout, a python tool's JSON) is refused.
    max_output_bytes: int = 10_000_000
    #: Who command tools run as (a user name or uid); None: ``nobody`` when a worker
    #: runs as root, else the worker's own user.
    tool_user: str | None = None
    #: Every write-capable tool waits for a person's approval (docs/approvals.md).
    approval_for_writes: bool = False
    #: An undecided approval expires after this many seconds.
    approval_ttl_s: float = 86400.0
    #: The audit stream keeps about this many events (Redis ``XADD MAXLEN ~``).
    audit_maxlen: int = 1_000_000
    #: The key workers seal the audit trail's chain with (``stores/audit_chain.py``);
    #: None: chained without a key (a gap or trim shows, a careful forgery does not).
    audit_key: str | None = field(default=None, repr=False)
    #: Run on a Redis whose maxmemory-policy evicts keys (it may drop queued
    #: invocations, write claims and results): refused unless this is set.
    allow_eviction: bool = False
    #: Every command tool and stdio MCP server runs in a sandbox (docs/runtime.md);
    #: a tool's own ``sandbox`` mapping refines it.
    sandbox: bool = False
    #: The bubblewrap program sandboxes are made with (a path, or a name on PATH).
    bwrap: str = "bwrap"
    #: The token of `cleveragents approvals serve` (docs/approvals.md, "In a browser").
    approvals_token: str | None = field(default=None, repr=False)
    #: The inbox's base URL as people reach it: the webhook's links point there.
    approvals_url: str | None = None
    #: Where a worker POSTs a call that starts waiting (``approvals/webhook.py``); a Slack
    #: webhook's URL is its secret, hence never shown.
    approval_webhook: str | None = field(default=None, repr=False)
    #: The primary Sentinel monitors, by the name it is monitored under
    #: (``sentinel://`` URLs; CLEVERAGENTS_SENTINEL_MASTER).
    sentinel_master: str = "mymaster"
    #: CLEVERAGENTS_REPLICA_WAIT_MS as given (None: not set; ``replica_wait_ms`` says
    #: what is in force).
    replica_wait_ms_given: int | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read settings from ``env`` (the process environment by default)."""
        env = os.environ if env is None else env
        home = Path(env.get("CLEVERAGENTS_HOME") or "./.cleveragents").expanduser()
        raw_catalogue = env.get("CLEVERAGENTS_CATALOGUE", "").strip()
        if raw_catalogue:
            paths = tuple(p for p in raw_catalogue.split(os.pathsep) if p)
        elif Path("skills").is_dir():
            paths = (str(Path("skills").resolve()),)
        else:
            paths = (str(bundled_examples_path()),)
        log_format = (env.get("CLEVERAGENTS_LOG_FORMAT") or "text").strip().lower()
        if log_format not in ("text", "json"):
            raise ConfigurationError(
                f"CLEVERAGENTS_LOG_FORMAT must be text or json, got {log_format!r}"
            )
        broker_url = (env.get("CLEVERAGENTS_BROKER_URL") or "").strip() or None
        result_backend = (env.get("CLEVERAGENTS_RESULT_BACKEND") or "").strip() or None
        _check_url("CLEVERAGENTS_BROKER_URL", broker_url, broker=True)
        _check_url("CLEVERAGENTS_RESULT_BACKEND", result_backend, broker=False)
        return cls(
            broker_url=broker_url,
            result_backend=result_backend,
            catalogue_paths=paths,
            read_only=_flag(env, "CLEVERAGENTS_READ_ONLY", False),
            home=home,
            default_timeout_s=_positive_float(env, "CLEVERAGENTS_DEFAULT_TIMEOUT_S", 300.0),
            log_format=log_format,
            visibility_timeout_s=_positive_float(env, "CLEVERAGENTS_VISIBILITY_TIMEOUT_S", 900.0),
            recovery_s=_positive_float(env, "CLEVERAGENTS_RECOVERY_S", 30.0),
            result_expires_s=_positive_float(env, "CLEVERAGENTS_RESULT_EXPIRES_S", 7 * 24 * 3600.0),
            tool_kinds=tool_kind_modules(env),
            remote_control=_flag(env, "CLEVERAGENTS_REMOTE_CONTROL", False),
            max_timeout_s=_positive_float(env, "CLEVERAGENTS_MAX_TIMEOUT_S", 3600.0),
            signing=MessageSigning.from_env(env),
            mcp_token=(env.get("CLEVERAGENTS_MCP_TOKEN") or "").strip() or None,
            max_output_bytes=_positive_int(env, "CLEVERAGENTS_MAX_OUTPUT_BYTES", 10_000_000),
            tool_user=(env.get("CLEVERAGENTS_TOOL_USER") or "").strip() or None,
            approval_for_writes=_flag(env, "CLEVERAGENTS_APPROVAL_FOR_WRITES", False),
            approval_ttl_s=_positive_float(env, "CLEVERAGENTS_APPROVAL_TTL_S", 86400.0),
            audit_maxlen=_positive_int(env, "CLEVERAGENTS_AUDIT_MAXLEN", 1_000_000),
            audit_key=(env.get("CLEVERAGENTS_AUDIT_KEY") or "").strip() or None,
            allow_eviction=_flag(env, "CLEVERAGENTS_ALLOW_EVICTION", False),
            sandbox=_flag(env, "CLEVERAGENTS_SANDBOX", False),
            bwrap=(env.get("CLEVERAGENTS_BWRAP") or "").strip() or "bwrap",
            approvals_token=(env.get("CLEVERAGENTS_APPROVALS_TOKEN") or "").strip() or None,
            approvals_url=(env.get("CLEVERAGENTS_APPROVALS_URL") or "").strip() or None,
            approval_webhook=(env.get("CLEVERAGENTS_APPROVAL_WEBHOOK") or "").strip() or None,
            **_replication(env),
        )

    @property
    def sentinel(self) -> bool:
        """True when the broker or the result backend is found through Redis Sentinel."""
        return any(
            (url or "").partition("://")[0].lower() in SENTINEL_SCHEMES
            for url in (self.broker_url, self.result_backend)
        )

    @property
    def replica_wait_ms(self) -> int:
        """How long a decisive write waits for a replica to acknowledge it (``WAIT 1 ms``;
        0: it does not wait): CLEVERAGENTS_REPLICA_WAIT_MS, else
        ``SENTINEL_REPLICA_WAIT_MS`` on a Sentinel fleet, else 0 (docs/guarantees.md)."""
        if self.replica_wait_ms_given is not None:
            return self.replica_wait_ms_given
        return SENTINEL_REPLICA_WAIT_MS if self.sentinel else 0

    @property
    def embedded(self) -> bool:
        """True when no broker is configured: the embedded default (the home's server) is used."""
        return self.broker_url is None
