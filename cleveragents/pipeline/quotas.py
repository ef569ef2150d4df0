"""A delivery's places under its tool's fleet-wide limits: the tool's own and its skill's.

At most N runs at once, at most N starts per window (the tool field ``limits``); the
gates that keep them are ``stores/quotas.py``. Over a limit, nothing is held and the
delivery learns how long to wait before it asks again.
"""

from __future__ import annotations

from collections.abc import Callable

from cleveragents.skills.catalogue import ToolPolicies
from cleveragents.stores.quotas import LimitGate, Permit

__all__ = ["limit_key", "take_limits"]


def limit_key(skill: str, tool: str | None) -> str:
    """Whose limit: a tool's own, or its skill's (``tool`` None), shared by its tools."""
    return f"{skill}|{tool}" if tool is not None else skill


def take_limits(
    gate: LimitGate, found: ToolPolicies, on_wait: Callable[[str, str, float], None]
) -> float | list[Permit]:
    """Places under the skill's limits, then the tool's: permits, or the seconds to wait
    before asking again (nothing held; ``on_wait`` is told)."""
    tool = found.tool
    taken: list[Permit] = []
    wanted = [
        (limit_key(found.skill, None), found.skill_limits),
        (limit_key(found.skill, tool.name), tool.limits),
    ]
    for key, limits in wanted:
        if not limits:
            continue
        outcome = gate.take(key, limits)
        if isinstance(outcome, float):
            for permit in taken:
                permit.release()
            on_wait(found.skill, tool.name, outcome)
            return outcome
        taken.append(outcome)
    return taken
