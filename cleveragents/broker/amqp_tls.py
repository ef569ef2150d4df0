"""TLS to RabbitMQ from the URL: ``amqps://...?ssl_ca_certs=/path/ca.pem``.

A ``rediss://`` URL carries its TLS settings as query parameters
(``ssl_cert_reqs=required&ssl_ca_certs=...``), which redis-py reads. kombu parses the same
parameters out of an ``amqps://`` URL, but py-amqp takes other names (``ca_certs``,
``cert_reqs``, ...) and rejects these; Celery's way is ``broker_use_ssl``, which no
environment variable reaches, and a URL's parameters would override it anyway. So the
fleet reads them here, in the spelling ``rediss://`` uses, and hands py-amqp its own:

* ``ssl_ca_certs``: the CA the node's certificate is checked against (checking is then
  on: ``ssl_cert_reqs`` defaults to ``required``);
* ``ssl_cert_reqs``: ``required``, ``optional`` or ``none`` (``CERT_REQUIRED``, ... too);
* ``ssl_certfile`` and ``ssl_keyfile``: a client certificate, for nodes that ask for one.

The host name is checked against the node's certificate (``server_hostname``: the host
each URL of a cluster list names; kombu keeps the first one's across a failover, so a
cluster's certificates should name every node, as the multi-host rig's do).
"""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from cleveragents.errors import ConfigurationError

__all__ = ["TLS_PARAMETERS", "amqps_tls"]

#: An ``amqps://`` URL's TLS parameters, and py-amqp's names for them.
TLS_PARAMETERS = {
    "ssl_ca_certs": "ca_certs",
    "ssl_cert_reqs": "cert_reqs",
    "ssl_certfile": "certfile",
    "ssl_keyfile": "keyfile",
}
_CHECKS = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}


def amqps_tls(url: str, setting: str = "CLEVERAGENTS_BROKER_URL") -> tuple[str, dict[str, Any]]:
    """``url`` without the TLS parameters of its ``amqps://`` parts (a cluster's list,
    ``;``-separated, each its own), and py-amqp's TLS options they give (Celery's
    ``broker_use_ssl``; empty: none given).

    Raises:
        ConfigurationError: an unknown ``ssl_*`` parameter or value, or parts of a list
            that disagree.
    """
    parts, found = [], []
    for part in url.split(";"):
        stripped, options = _split(part.strip(), setting)
        parts.append(stripped)
        if options:
            found.append(options)
    if any(options != found[0] for options in found):
        raise ConfigurationError(
            f"{setting}: the amqps:// URLs of the list give different ssl_* parameters; give "
            "each the same CA"
        )
    return ";".join(parts), (found[0] if found else {})


def _split(url: str, setting: str) -> tuple[str, dict[str, Any]]:
    parsed = urlsplit(url)
    if parsed.scheme.lower() != "amqps" or "ssl_" not in parsed.query:
        return url, {}
    kept: list[tuple[str, str]] = []
    given: dict[str, Any] = {}
    for name, value in parse_qsl(parsed.query, keep_blank_values=True):
        if not name.startswith("ssl_"):
            kept.append((name, value))
        elif name in TLS_PARAMETERS:
            given[TLS_PARAMETERS[name]] = value
        else:
            raise ConfigurationError(
                f"{setting}: unknown TLS parameter {name!r} in an amqps:// URL; it takes "
                f"{', '.join(TLS_PARAMETERS)}"
            )
    given["cert_reqs"] = _check(given.get("cert_reqs", "required"), setting)
    if given["cert_reqs"] != ssl.CERT_NONE:
        given["server_hostname"] = None  # kombu puts the host each connection goes to
    return urlunsplit(parsed._replace(query=urlencode(kept))), given


def _check(value: str, setting: str) -> ssl.VerifyMode:
    key = value.lower().removeprefix("cert_")
    if key not in _CHECKS:
        raise ConfigurationError(
            f"{setting}: ssl_cert_reqs={value!r} in an amqps:// URL; it takes required, "
            "optional or none"
        )
    return _CHECKS[key]
