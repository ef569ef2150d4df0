"""``execute``: one delivered invocation through the guard and the runtime, then observed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cleveragents.pipeline.binding import cancelled_result, content_digest, reused_result
from cleveragents.pipeline.guard import Guard
from cleveragents.pipeline.limits import LimitGate, Permit, limit_key
from cleveragents.runtime import DEFAULT_TIMEOUT_S
from cleveragents.runtime import invoke as run_invocation
from cleveragents.runtime.invoke import MAX_TIMEOUT_S, BeforeWrite
from cleveragents.skills import Catalogue, SkillResult
from cleveragents.skills.catalogue import ToolPolicies
from cleveragents.stores import ResultStore, StartedMark, Stores

__all__ = ["Observer", "Pipeline", "execute"]

#: Told of every finished invocation (a worker logs its line and counts it).
Observer = Callable[[str, SkillResult], None]


def _unobserved(request_id: str, result: SkillResult) -> None:
    """The default observer: nothing is reported."""


def _no_wait(skill: str, tool: str, seconds: float) -> None:
    """The default of ``Pipeline.on_wait``: nothing is counted."""


@dataclass(frozen=True)
class Pipeline:
    """What every invocation in a worker process needs: catalogue, policy, guard and stores."""

    catalogue: Catalogue
    guard: Guard
    results: ResultStore
    read_only: bool = False
    default_timeout_s: float = DEFAULT_TIMEOUT_S
    max_timeout_s: float = MAX_TIMEOUT_S
    observe: Observer = field(default=_unobserved)
    #: Where fleet-wide limits are taken (None: no limit is kept).
    limit_gate: LimitGate | None = None
    #: Told of each invocation sent back to wait for a limit: skill, tool, seconds.
    on_wait: Callable[[str, str, float], None] = field(default=_no_wait)

    @classmethod
    def over(
        cls,
        catalogue: Catalogue,
        stores: Stores,
        *,
        read_only: bool = False,
        default_timeout_s: float = DEFAULT_TIMEOUT_S,
        max_timeout_s: float = MAX_TIMEOUT_S,
        observe: Observer = _unobserved,
        limit_gate: LimitGate | None = None,
        on_wait: Callable[[str, str, float], None] = _no_wait,
    ) -> Pipeline:
        """A pipeline whose guard and results live in ``stores``."""
        return cls(
            catalogue,
            Guard(stores.guard),
            stores.results,
            read_only=read_only,
            default_timeout_s=default_timeout_s,
            max_timeout_s=max_timeout_s,
            observe=observe,
            limit_gate=limit_gate,
            on_wait=on_wait,
        )

    def policy_tool(self, body: Any) -> ToolPolicies | None:
        """The policies of the catalogue tool ``body`` asks for (None: there is no such
        tool; the run says why)."""
        if not isinstance(body, dict):
            return None
        return self.catalogue.policies(body.get("skill"), body.get("tool"))

    def take_limits(self, found: ToolPolicies) -> float | list[Permit]:
        """Places under the tool's limits and its skill's: permits, or the seconds to
        wait before asking again (nothing held)."""
        tool = found.tool
        taken: list[Permit] = []
        if self.limit_gate is None:
            return taken
        wanted = [
            (limit_key(found.skill, None), found.skill_limits),
            (limit_key(found.skill, tool.name), tool.limits),
        ]
        for key, limits in wanted:
            if not limits:
                continue
            outcome = self.limit_gate.take(key, limits)
            if isinstance(outcome, float):
                for permit in taken:
                    permit.release()
                self.on_wait(found.skill, tool.name, outcome)
                return outcome
            taken.append(outcome)
        return taken

    def run(self, body: Any, before_write: BeforeWrite | None = None) -> SkillResult:
        """Run one decoded request body through the runtime with this process's policy."""
        return run_invocation(
            body,
            self.catalogue,
            read_only=self.read_only,
            default_timeout_s=self.default_timeout_s,
            max_timeout_s=self.max_timeout_s,
            before_write=before_write,
        )

    def answered(
        self, body: Any, request_id: str, started: StartedMark | None = None
    ) -> SkillResult | None:
        """The answer to a delivery that must not run, if it is one.

        Its id bound to other content: the ``request_id_reused`` refusal. Its id bound
        to this content with a result stored that answers it: that result. Both store
        nothing. Its id cancelled before any run of it started: the ``cancelled``
        failure, which is stored as its result. Where the delivery runs, ``started``
        (if given) is stored first. The first delivery of an id costs one round trip
        on Redis, its ``STARTED`` and its cancel mark included.
        """
        digest = content_digest(body)
        if started is None:
            [before] = self.guard.store.bind([(request_id, digest)])
            marked = False
        else:
            before, marked, cancelled = self.guard.store.bind_starting(request_id, digest, started)
            if cancelled:
                return cancelled_result(body, request_id)
        if before is None:
            return None
        if before != digest:
            return reused_result(body)
        if marked:  # no finished result is stored: it runs
            return None
        writes = isinstance(body, dict) and body.get("allow_writes") is True
        [stored] = self.results.reusable([request_id], [writes])
        if stored is not None:
            return SkillResult.model_validate(stored)
        if started is not None:
            started.write()
        return None

    def run_guarded(
        self,
        body: Any,
        request_id: str,
        *,
        redelivered: bool,
        chunk_item: bool = False,
        resent: str = "",
    ) -> SkillResult:
        """Run one delivery under the guard: counted, its write claimed, perhaps not run at all.

        ``resent`` tells a message sent back to the broker (a retry, a wait for a limit)
        from the others under its id (``tasks/resend.py``).
        """
        with self.guard.delivery(
            request_id, body, redelivered=redelivered, chunk_item=chunk_item, resent=resent
        ) as delivery:
            return delivery.settled or delivery.finish(self.run(body, delivery.claim))


def execute(pipeline: Pipeline, body: Any, *, request_id: str, redelivered: bool) -> SkillResult:
    """Run one delivered invocation; every outcome is a ``SkillResult``.

    ``request_id`` is the message's task id: the guard counts and claims under it.
    A message without one (not our producer's) runs unguarded: there is no id to
    store its result under anyway.
    """
    if request_id:
        result = pipeline.run_guarded(body, request_id, redelivered=redelivered)
    else:
        result = pipeline.run(body)
    pipeline.observe(request_id, result)
    return result
