"""Python tools: ``module:function`` from the catalogue, imported once per process."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any

from cleveragents.errors import ToolActivationError
from cleveragents.runtime.deadline import call_with_deadline
from cleveragents.skills import ToolSpec

__all__ = ["activate", "run_python_tool"]

_functions: dict[str, Callable[..., Any]] = {}
_lock = threading.Lock()


def activate(tool: ToolSpec) -> Callable[..., Any]:
    """The tool's function, imported the first time it is needed.

    Raises:
        ToolActivationError: the module is missing or fails to import, or has no such callable.
    """
    entrypoint = tool.entrypoint or ""
    fn = _functions.get(entrypoint)
    if fn is not None:
        return fn
    module_name, _, attr_path = entrypoint.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or anything the module raises while importing
        raise ToolActivationError(
            f"tool activation failed for {tool.name!r}: cannot import {module_name!r}: "
            f"{type(exc).__name__}: {exc}",
            details={"entrypoint": entrypoint, "cause": type(exc).__name__},
        ) from None
    for part in attr_path.split("."):
        target = getattr(target, part, None)
        if target is None:
            break
    if target is None or not callable(target):
        raise ToolActivationError(
            f"tool activation failed for {tool.name!r}: {entrypoint!r} is not a callable",
            details={"entrypoint": entrypoint},
        )
    with _lock:
        _functions[entrypoint] = target
    return target  # type: ignore[no-any-return]


def run_python_tool(tool: ToolSpec, arguments: dict[str, Any], timeout_s: float) -> Any:
    """Call the tool with the arguments as keyword arguments, stopped at ``timeout_s``.

    Raises:
        ToolActivationError: see ``activate``.
        ToolTimeout: the tool ran out of time (it has been stopped).
        BaseException: whatever the tool raised.
    """
    fn = activate(tool)
    return call_with_deadline(fn, timeout_s, **arguments)
