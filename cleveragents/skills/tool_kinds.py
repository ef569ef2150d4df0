"""Tool kinds: the names a tool's ``source`` may take, and the object that runs each.

A tool kind is any object with ``run(tool, arguments, timeout_s)`` (``ToolKind``);
the runtime calls it, the skill model only asks which kinds exist and lets a
kind check its own fields. Adding a kind is one module that calls
``cleveragents.runtime.register_tool_kind(name, runner)``; nothing that
dispatches changes.

The built-in kinds (``python``, ``command``, ``mcp``) are registered by ``module:attr``
name and imported the first time a tool of theirs is validated or run: the
skills layer imports no runtime code.
"""

from __future__ import annotations

import importlib
import re
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from cleveragents.skills.model import ToolSpec

__all__ = [
    "BUILTIN_KINDS",
    "KIND_NAME_PATTERN",
    "ToolKind",
    "check_tool",
    "is_known",
    "kind_names",
    "lookup",
    "option_fields",
    "register",
    "reserve_fields",
    "sandboxable",
]

#: The kinds every process knows, by name of the object that runs them.
BUILTIN_KINDS = {
    "python": "cleveragents.runtime.kinds.python:KIND",
    "command": "cleveragents.runtime.kinds.command:KIND",
    "mcp": "cleveragents.runtime.kinds.mcp:KIND",
}
#: What a kind's name looks like (it is the ``source`` of its tools).
KIND_NAME_PATTERN = r"^[a-z][a-z0-9_.-]*$"
_KIND_NAME_RE = re.compile(KIND_NAME_PATTERN)


class ToolKind(Protocol):
    """Runs the tools of one ``source``; what ``register_tool_kind`` accepts.

    ``run`` returns JSON data or a ``cleveragents.runtime.ToolOutput``. It stops
    the tool by ``timeout_s`` and then raises ``cleveragents.errors.ToolTimedOut``;
    every other failure is a library error (``ToolActivationError``: the tool
    cannot be started; ``ToolExecutionError``: it failed while running, the
    tool's own exception class name in ``details["exception_type"]``;
    ``SchemaValidationError``), or a ``PermissionError`` for ``permission_denied``.

    Optional members, looked up once at registration:

    - ``check(tool) -> None``: raises ``ValueError`` when a tool's spec is not
      valid for this kind; called when a ``ToolSpec`` is validated, so a bad
      spec is a load problem of its file.
    - ``option_fields``: names of kind-specific keys that a skill file may
      write beside the common ones (``server:``, ``remote_tool:``); they are
      collected into ``ToolSpec.options``.
    - ``sandboxable``: True, or ``(tool) -> bool``, when the kind runs a tool in
      its ``sandbox`` (``command``; ``mcp`` for a stdio server); a tool of any
      other kind that asks for one is refused, so a sandboxed tool never runs
      unsandboxed (and ``CLEVERAGENTS_SANDBOX=1`` covers exactly these tools).
    """

    def run(self, tool: ToolSpec, arguments: dict[str, Any], timeout_s: float) -> Any:
        """Run ``tool`` with validated ``arguments``; stop it by ``timeout_s``."""
        ...


@dataclass(frozen=True)
class _Kind:
    runner: ToolKind
    check: Callable[[ToolSpec], None] | None
    option_fields: frozenset[str]
    sandboxable: Callable[[ToolSpec], bool]


_kinds: dict[str, _Kind] = {}
_pending: dict[str, str] = dict(BUILTIN_KINDS)
_lock = threading.Lock()


def _describe(runner: Any) -> _Kind:
    if not callable(getattr(runner, "run", None)):
        raise TypeError(f"a tool kind needs a run(tool, arguments, timeout_s) method: {runner!r}")
    check = getattr(runner, "check", None)
    if check is not None and not callable(check):
        raise TypeError(f"a tool kind's check must be callable: {runner!r}")
    fields = getattr(runner, "option_fields", ())
    if isinstance(fields, str) or not isinstance(fields, Collection):
        raise TypeError(f"a tool kind's option_fields must be a collection of names: {runner!r}")
    clash = sorted(set(fields) & _common_fields)
    if clash:
        raise ValueError(f"option_fields {clash} are common ToolSpec fields")
    sandboxable = getattr(runner, "sandboxable", False)
    if not callable(sandboxable):
        sandboxable = lambda _tool, able=sandboxable is True: able  # noqa: E731
    return _Kind(runner, check, frozenset(fields), sandboxable)


#: ``ToolSpec``'s own field names, which no kind may claim as options (set by the model).
_common_fields: set[str] = set()


def reserve_fields(names: Collection[str]) -> None:
    """Record the tool spec's common fields (the skill model calls this once it is defined)."""
    _common_fields.update(names)


def register(name: str, runner: ToolKind) -> None:
    """Add kind ``name``; registering the same runner again does nothing.

    Raises:
        ValueError: the name is not a kind name, or another runner has it.
        TypeError: ``runner`` has no ``run`` method.
    """
    if not isinstance(name, str) or not _KIND_NAME_RE.match(name):
        raise ValueError(f"tool kind name {name!r} must match {KIND_NAME_PATTERN}")
    kind = _describe(runner)
    with _lock:
        known = _kinds.get(name)
        if known is not None and known.runner is runner:
            return
        if known is not None or name in _pending:
            raise ValueError(f"tool kind {name!r} is already registered")
        _kinds[name] = kind


def _resolve(name: str) -> _Kind | None:
    kind = _kinds.get(name)
    if kind is not None:
        return kind
    target = _pending.get(name)
    if target is None:
        return None
    module_name, _, attr = target.partition(":")
    described = _describe(getattr(importlib.import_module(module_name), attr))
    with _lock:
        _pending.pop(name, None)
        return _kinds.setdefault(name, described)


def is_known(name: str) -> bool:
    """Whether ``name`` is a registered tool kind (built-in or added)."""
    return name in _kinds or name in _pending


def kind_names() -> list[str]:
    """Every registered kind, sorted."""
    return sorted({*_kinds, *_pending})


def lookup(name: str) -> ToolKind | None:
    """The runner of kind ``name``, or None when no such kind is registered."""
    kind = _kinds.get(name) or _resolve(name)
    return None if kind is None else kind.runner


def option_fields(name: str) -> frozenset[str]:
    """The kind-specific keys kind ``name`` takes (none for an unknown kind)."""
    kind = _resolve(name)
    return frozenset() if kind is None else kind.option_fields


def check_tool(tool: ToolSpec) -> None:
    """Run the kind's own check of ``tool``, and refuse options the kind does not take.

    Raises:
        ValueError: the spec is not valid for its kind.
    """
    kind = _resolve(tool.source)
    if kind is None:
        raise ValueError(f"unknown tool source {tool.source!r}; known: {', '.join(kind_names())}")
    unknown = sorted(set(tool.options) - kind.option_fields)
    if unknown:
        raise ValueError(
            f"{tool.source} tool {tool.name!r} does not take options {', '.join(unknown)}"
        )
    if kind.check is not None:
        kind.check(tool)
    if tool.sandbox is not None and not kind.sandboxable(tool):
        raise ValueError(
            f"{tool.source} tool {tool.name!r} cannot run in a sandbox: only command tools and "
            "stdio MCP servers do (a python tool runs inside the worker); drop sandbox, or "
            "make it a command tool"
        )


def sandboxable(tool: ToolSpec) -> bool:
    """Whether ``tool``'s kind runs it in a sandbox when it has one (a checked tool)."""
    kind = _resolve(tool.source)
    return kind is not None and kind.sandboxable(tool)
