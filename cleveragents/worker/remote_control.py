"""Remote control a worker obeys: inspection always, commands that change it only when allowed.

Anyone who can publish to the broker can broadcast to every worker. Inspection
(``inspect active``, ``stats``, ``ping``, what Flower's worker pages read) and
events stay on. The commands that change a worker (stop it, restart its pool,
make it consume another queue, change its limits) are answered with an error
unless ``CLEVERAGENTS_REMOTE_CONTROL=1``. The worker keeps its own copy of the
command table: Celery's global ``Panel`` is left as it is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from celery.worker.consumer.control import Control

__all__ = ["CHANGING_COMMANDS", "GuardedControl", "guarded_handlers"]

log = logging.getLogger("cleveragents.worker")

#: Broadcast commands that change a worker; off unless CLEVERAGENTS_REMOTE_CONTROL=1.
CHANGING_COMMANDS = frozenset(
    {
        "shutdown",
        "pool_restart",
        "add_consumer",
        "cancel_consumer",
        "autoscale",
        "pool_grow",
        "pool_shrink",
        "rate_limit",
        "time_limit",
    }
)


def _refuser(name: str) -> Callable[..., dict[str, str]]:
    def refuse(state: Any, **_: Any) -> dict[str, str]:
        log.warning("refused the broadcast command %r (CLEVERAGENTS_REMOTE_CONTROL is off)", name)
        return {"error": f"{name} is disabled on this worker (CLEVERAGENTS_REMOTE_CONTROL=0)"}

    return refuse


def guarded_handlers(handlers: Mapping[str, Any], *, allow_changes: bool) -> dict[str, Any]:
    """A copy of ``handlers`` where the commands that change a worker refuse, unless allowed."""
    table = dict(handlers)
    if not allow_changes:
        for name in CHANGING_COMMANDS & set(table):
            table[name] = _refuser(name)
    return table


class GuardedControl(Control):  # type: ignore[misc]
    """Celery's remote-control step, with this worker's own command table."""

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        from cleveragents.worker import state  # the worker's settings, loaded once per process

        node = getattr(self, "box").node  # noqa: B009 - set by Celery's Control
        node.handlers = guarded_handlers(
            node.handlers, allow_changes=state.current().settings.remote_control
        )
