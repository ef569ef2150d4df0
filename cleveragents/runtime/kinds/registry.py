"""The tool-kind seam: ``register_tool_kind``, plugin modules, and the one dispatch.

A kind is one module with an object that has ``run(tool, arguments, timeout_s)``
(``ToolKind``) and a call to ``register_tool_kind``. A worker and the CLI import
the modules named by ``CLEVERAGENTS_TOOL_KINDS`` before they load the catalogue,
so a skill file may use ``source: <kind>``.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

from cleveragents.errors import ConfigurationError, ToolActivationError, ToolTimedOut
from cleveragents.runtime.pauses import pause_clock
from cleveragents.skills import ToolSpec, tool_kinds
from cleveragents.skills.tool_kinds import ToolKind

__all__ = ["ToolKind", "load_tool_kinds", "register_tool_kind", "run_tool"]


def register_tool_kind(name: str, runner: ToolKind) -> None:
    """Add a tool kind: tools with ``source: name`` run through ``runner.run``.

    ``runner.run(tool, arguments, timeout_s)`` returns JSON data or a
    ``ToolOutput`` and raises only library errors (see ``ToolKind``). Call it
    at import of the kind's module; registering the same runner twice does nothing.

    Raises:
        ValueError: ``name`` is not a kind name (``[a-z][a-z0-9_.-]*``), or is taken.
        TypeError: ``runner`` has no ``run`` method.
    """
    tool_kinds.register(name, runner)


@contextlib.contextmanager
def _current_folder_importable() -> Iterator[None]:
    # As for a worker (`python -m celery` searches the current folder, like Celery's
    # import_from_cwd): the CLI's console script does not, and must find the same modules.
    cwd = os.getcwd()
    if cwd in sys.path or "" in sys.path:
        yield
        return
    sys.path.insert(0, cwd)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(cwd)


def load_tool_kinds(modules: Iterable[str]) -> None:
    """Import each plugin module (each registers its kinds), in order.

    Modules are found as a worker finds them: installed, on ``PYTHONPATH``, or in
    the current folder.

    Raises:
        ConfigurationError: a module cannot be imported, or its registration fails.
    """
    names = list(modules)
    if not names:
        return
    with _current_folder_importable():
        for name in names:
            try:
                importlib.import_module(name)
            except Exception as exc:  # ImportError, or what the module raises while importing
                raise ConfigurationError(
                    f"CLEVERAGENTS_TOOL_KINDS: cannot load tool kind module {name!r}: "
                    f"{type(exc).__name__}: {exc}"
                ) from None


def run_tool(tool: ToolSpec, arguments: dict[str, Any], timeout_s: float) -> Any:
    """Run ``tool`` through its kind; what comes back after ``timeout_s`` is a time-out.

    The kind stops the tool by the deadline; the deadline is also absolute here,
    so a kind that returns late fails the same way as one that was stopped.

    Raises:
        ToolActivationError: no kind of that name is registered in this process.
        ToolTimedOut: the tool was stopped, or its result came after the deadline.
    """
    runner = tool_kinds.lookup(tool.source)
    if runner is None:
        raise ToolActivationError(
            f"tool activation failed for {tool.name!r}: no tool kind {tool.source!r} "
            f"in this process (known: {', '.join(tool_kinds.kind_names())}; "
            "CLEVERAGENTS_TOOL_KINDS loads more)",
            details={"source": tool.source},
        )
    clock, started = pause_clock(), time.monotonic()
    value = runner.run(tool, arguments, timeout_s)
    # Its running time: a pause of this process (a frozen worker) is not the tool's.
    if time.monotonic() - clock.paused_since(started) > started + timeout_s:
        raise ToolTimedOut(tool.name, timeout_s)
    return value
