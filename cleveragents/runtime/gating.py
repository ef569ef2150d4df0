"""Write gating: a write-capable tool runs only when every gate allows it (SPEC section 6)."""

from __future__ import annotations

from cleveragents.errors import WriteRefused
from cleveragents.skills import SkillDefinition, ToolSpec

__all__ = ["GATE_REQUEST", "GATE_SKILL_READ_ONLY", "GATE_WORKER_READ_ONLY", "check_write_gates"]

#: The skill's metadata says it is read-only.
GATE_SKILL_READ_ONLY = "skill_read_only"
#: The request did not set ``allow_writes``.
GATE_REQUEST = "request_disallows_writes"
#: The runtime (the worker) runs read-only.
GATE_WORKER_READ_ONLY = "worker_read_only"


def check_write_gates(
    definition: SkillDefinition, tool: ToolSpec, *, allow_writes: bool, read_only: bool
) -> None:
    """Refuse a write-capable tool unless the skill, the request and the runtime all allow it.

    Raises:
        WriteRefused: with ``details["gate"]`` naming the first gate that refused and
            ``details["gates"]`` every gate that would have.
    """
    if not tool.write_capable:
        return
    gates = []
    if definition.metadata.read_only:
        gates.append(GATE_SKILL_READ_ONLY)
    if not allow_writes:
        gates.append(GATE_REQUEST)
    if read_only:
        gates.append(GATE_WORKER_READ_ONLY)
    if gates:
        kind = "writes" if tool.writes else "has side effects"
        raise WriteRefused(
            f"tool {tool.name!r} {kind} and was refused: {', '.join(gates)}",
            details={"gate": gates[0], "gates": gates},
        )
