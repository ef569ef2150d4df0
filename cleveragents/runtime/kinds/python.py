"""The ``python`` tool kind: ``module:function`` from the catalogue, imported once per process.

The module is looked for in the tool's skill folder first, under a package of
that folder's own, then as usual (installed, ``PYTHONPATH``): see
``skill_imports``. A function is kept per skill folder and entrypoint, so two
folders' ``tools:run`` are two functions.

The tool runs in the worker process, interrupted at its timeout (``deadline``).
This module turns whatever the tool raises into the library's errors: a
time-out into ``ToolTimedOut``, ``sys.exit`` and the tool's own exceptions into
``ToolExecutionError`` (the class name in ``details["exception_type"]``); a
``PermissionError`` passes through as ``permission_denied``. A copy of the
process that the tool forked ends as soon as it returns (or raises): only the
process that called the tool goes on. A tool that changes the working folder
has it changed back once it is done.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cleveragents.errors import (
    SchemaValidationError,
    ToolActivationError,
    ToolExecutionError,
    ToolTimedOut,
)
from cleveragents.runtime.deadline import ToolTimeout, call_with_deadline
from cleveragents.runtime.skill_imports import import_from_folder
from cleveragents.skills import ToolSpec

__all__ = ["KIND", "PythonKind", "activate", "run_python_tool"]

_ENTRYPOINT_RE = re.compile(
    r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$"
)
_functions: dict[tuple[Path | None, str], Callable[..., Any]] = {}
_lock = threading.Lock()


def activate(tool: ToolSpec) -> Callable[..., Any]:
    """The tool's function, imported the first time it is needed.

    Raises:
        ToolActivationError: the module is missing or fails to import, or has no such callable.
    """
    entrypoint = tool.entrypoint or ""
    key = (tool.skill_folder, entrypoint)
    fn = _functions.get(key)
    if fn is not None:
        return fn
    module_name, _, attr_path = entrypoint.partition(":")
    try:
        target: Any = import_from_folder(module_name, tool.skill_folder)
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
        _functions[key] = target
    return target  # type: ignore[no-any-return]


def run_python_tool(tool: ToolSpec, arguments: dict[str, Any], timeout_s: float) -> Any:
    """Call the tool with the arguments as keyword arguments, stopped at ``timeout_s``.

    Raises:
        ToolActivationError: see ``activate``.
        ToolTimedOut: the tool ran out of time (it has been stopped).
        ToolExecutionError: the tool raised, or called ``sys.exit``.
        PermissionError: the tool's own, which is ``permission_denied``.
    """
    fn = activate(tool)
    pid, folder = os.getpid(), os.getcwd()
    try:
        return call_with_deadline(fn, timeout_s, **arguments)
    except ToolTimeout:
        raise ToolTimedOut(tool.name, timeout_s) from None
    except (PermissionError, ToolActivationError, ToolExecutionError, SchemaValidationError):
        raise  # already what the runtime reports (library errors raised by a tool included)
    except SystemExit as exc:
        raise ToolExecutionError(
            f"tool {tool.name!r} called sys.exit({exc.code!r})",
            details={
                "exit_code": exc.code if isinstance(exc.code, int) else None,
                "exception_type": type(exc).__name__,
            },
        ) from None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # Exception, or e.g. asyncio.CancelledError: the tool's own
        raise ToolExecutionError(
            f"{type(exc).__name__}: {exc}", details={"exception_type": type(exc).__name__}
        ) from exc
    finally:
        if os.getpid() != pid:  # a copy the tool forked, on its way back into the pool's
            os._exit(0)  # loop: it would take tasks as a pool process nobody knows
        if os.getcwd() != folder:  # relative paths mean the same for the next invocation
            os.chdir(folder)


class PythonKind:
    """Tools that are Python functions, run in the worker process (``source: python``)."""

    def check(self, tool: ToolSpec) -> None:
        """A python tool needs ``entrypoint: module:function`` and no ``command``."""
        if not tool.entrypoint or not _ENTRYPOINT_RE.match(tool.entrypoint):
            raise ValueError(
                f"python tool {tool.name!r} needs entrypoint 'module:function', "
                f"got {tool.entrypoint!r}"
            )
        if tool.command is not None:
            raise ValueError(f"python tool {tool.name!r} must not set command")

    #: Call the tool's function (no extra frame: this is every python invocation's path).
    run = staticmethod(run_python_tool)


#: The registered ``python`` kind.
KIND = PythonKind()
