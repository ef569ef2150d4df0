"""The approvals inbox: ``cleveragents approvals serve``, people decide in a browser.

- ``access``: who may come in (the token, the session cookie, CSRF, Origin).
- ``pages``: the HTML, rendered on the server, every value escaped.
- ``app``: the routes, over the same ``ApprovalDesk`` as the CLI.
- ``serve``: the command's body (the client, uvicorn without its access log).

It builds on ``cleveragents.mcp.http`` (loopback names, ``HostGuard``), which imports
the MCP SDK: the CLI imports this package only when the command runs.
"""

from __future__ import annotations

from cleveragents.inbox.access import TOKEN_ENV, check_inbox_options

__all__ = ["TOKEN_ENV", "check_inbox_options"]
