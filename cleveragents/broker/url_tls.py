"""TLS from the URL, spelled as on ``rediss://``: ``amqps://`` and ``sentinel://`` URLs.

A ``rediss://`` URL carries its TLS settings as query parameters
(``ssl_cert_reqs=required&ssl_ca_certs=...``), which redis-py reads. The fleet is
configured by its URLs alone, so two other kinds of URL take the same parameters:

* ``ssl_ca_certs``: the CA a server's certificate is checked against (checking is then
  on: ``ssl_cert_reqs`` defaults to ``required``);
* ``ssl_cert_reqs``: ``required``, ``optional`` or ``none`` (``CERT_REQUIRED``, ... too);
* ``ssl_certfile`` and ``ssl_keyfile``: a client certificate, for servers that ask for one.

**amqps://** (``amqps_tls``). kombu parses these out of the URL, but py-amqp takes other
names (``ca_certs``, ``cert_reqs``, ...) and rejects these; Celery's way is
``broker_use_ssl``, which a URL's parameters would override anyway. They become
py-amqp's options, with the host name checked (``server_hostname``: the host each URL of
a cluster list names; kombu keeps the first one's across a failover, so a cluster's
certificates should name every node, as the multi-host rig's do).

**sentinel://** (``sentinel_tls``). Celery and kombu take a Sentinel fleet's TLS from
settings only: ``broker_use_ssl`` and ``redis_backend_use_ssl`` for the servers the
Sentinels name, ``sentinel_kwargs`` for the Sentinels. One set serves both, as a
Sentinel fleet on TLS speaks it on every port (Redis's ``tls-port`` with ``port 0``,
``tls-replication yes`` on servers and Sentinels).

Each URL of a ``;``-separated list may carry them; those that do must agree.
"""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from cleveragents.errors import ConfigurationError

__all__ = ["TLS_PARAMETERS", "amqps_tls", "sentinel_tls"]

#: The TLS parameters of a URL, and py-amqp's names for them.
TLS_PARAMETERS = {
    "ssl_ca_certs": "ca_certs",
    "ssl_cert_reqs": "cert_reqs",
    "ssl_certfile": "certfile",
    "ssl_keyfile": "keyfile",
}
_CHECKS = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}


def amqps_tls(url: str, setting: str = "CLEVERAGENTS_BROKER_URL") -> tuple[str, dict[str, Any]]:
    """``url`` without the TLS parameters of its ``amqps://`` parts (a cluster's list),
    and py-amqp's TLS options they give (Celery's ``broker_use_ssl``; empty: none given).

    Raises:
        ConfigurationError: an unknown ``ssl_*`` parameter or value, or parts of a list
            that disagree.
    """
    stripped, given = _split_list(url, "amqps", setting)
    if not given:
        return stripped, {}
    options: dict[str, Any] = {TLS_PARAMETERS[name]: value for name, value in given.items()}
    if options["cert_reqs"] != ssl.CERT_NONE:
        options["server_hostname"] = None  # kombu puts the host each connection goes to
    return stripped, options


def sentinel_tls(url: str, setting: str) -> tuple[str, dict[str, Any]]:
    """``url`` without the TLS parameters of its ``sentinel://`` parts, and redis-py's TLS
    options they give, for the Sentinels and the servers alike (empty: none given).

    Raises:
        ConfigurationError: as ``amqps_tls``.
    """
    return _split_list(url, "sentinel", setting)


def _split_list(url: str, scheme: str, setting: str) -> tuple[str, dict[str, Any]]:
    parts, found = [], []
    for part in url.split(";"):
        stripped, options = _split(part.strip(), scheme, setting)
        parts.append(stripped)
        if options:
            found.append(options)
    if any(options != found[0] for options in found):
        raise ConfigurationError(
            f"{setting}: the {scheme}:// URLs of the list give different ssl_* parameters; "
            "give each the same CA"
        )
    return ";".join(parts), (found[0] if found else {})


def _split(url: str, scheme: str, setting: str) -> tuple[str, dict[str, Any]]:
    parsed = urlsplit(url)
    if parsed.scheme.lower() != scheme or "ssl_" not in parsed.query:
        return url, {}
    kept: list[tuple[str, str]] = []
    given: dict[str, Any] = {}
    for name, value in parse_qsl(parsed.query, keep_blank_values=True):
        if not name.startswith("ssl_"):
            kept.append((name, value))
        elif name in TLS_PARAMETERS:
            given[name] = value
        else:
            raise ConfigurationError(
                f"{setting}: unknown TLS parameter {name!r} in {_a(scheme)}:// URL; it takes "
                f"{', '.join(TLS_PARAMETERS)}"
            )
    given["ssl_cert_reqs"] = _check(given.get("ssl_cert_reqs", "required"), scheme, setting)
    return urlunsplit(parsed._replace(query=urlencode(kept))), given


def _check(value: str, scheme: str, setting: str) -> ssl.VerifyMode:
    key = value.lower().removeprefix("cert_")
    if key not in _CHECKS:
        raise ConfigurationError(
            f"{setting}: ssl_cert_reqs={value!r} in {_a(scheme)}:// URL; it takes required, "
            "optional or none"
        )
    return _CHECKS[key]


def _a(scheme: str) -> str:
    return f"an {scheme}" if scheme[0] in "aeiou" else f"a {scheme}"
