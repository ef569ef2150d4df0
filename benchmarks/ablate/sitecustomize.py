"""Leaves out some of the worker's promises, to price them: ``compare.py --ablate``.

Put this folder first on ``PYTHONPATH`` and set ``BENCH_ABLATE`` to a comma-separated
list of the names below: Python imports ``sitecustomize`` at start-up, and this one
changes the named parts of cleveragents as their modules are imported, in the worker
and in the producer alike. A run with them left out is **not** the product: it gives
wrong answers to hostile producers, stuck tools and redeliveries, and exists only to
measure what each promise costs. Without ``BENCH_ABLATE`` it does nothing; it is never
on the path of a normal run.

``bind``      no id binding: neither the producer nor the worker binds a request id to
              its content (``cleveragents.pipeline.binding``), so a reused id is not caught
``lookups``   no stored-result lookups: a chunk runs every line, even one a
              redelivery finished, and the producer's resume finds nothing
``schema``    no JSON Schema validation of arguments and outputs
``deadline``  no timeout: the tool is called with no timer armed
``observe``   no invocation log line and no metrics
``transport`` kombu's own Redis transport and Celery's own Redis result backend: no
              fetch that takes and records a message at once (``broker/redis/fetch.py``),
              no holders and heartbeats (a dead worker's messages wait for the
              visibility timeout), no doorbells, and a state stored with a ``GET`` then
              a ``SET`` (a late ``STARTED`` can overwrite a success)
"""

from __future__ import annotations

import os

#: The promises that can be left out, each with the modules it changes.
NAMES = ("bind", "lookups", "schema", "deadline", "observe", "transport")


def _patches(wanted: set[str]) -> dict[str, list[object]]:
    """module name -> functions that change it once it has run."""

    def no_producer_bind(module: object) -> None:
        module.SkillClient.bound_elsewhere = lambda self, requests: [False] * len(requests)  # type: ignore[attr-defined]

    def no_worker_bind(module: object) -> None:
        module._Slice._bound_elsewhere = lambda self, bodies, ids: set()  # type: ignore[attr-defined]

    def no_lookups(module: object) -> None:
        module.KeyValueResults.reusable = lambda self, ids, writes: [None] * len(ids)  # type: ignore[attr-defined]

    def no_schema(module: object) -> None:
        module.validate = lambda *args, **kwargs: None  # type: ignore[attr-defined]

    def no_deadline(module: object) -> None:
        module.call_with_deadline = lambda fn, timeout_s, /, *a, **kw: fn(*a, **kw)  # type: ignore[attr-defined]

    def no_observer(module: object) -> None:
        module.WorkerObserver.__call__ = lambda self, request_id, result: None  # type: ignore[attr-defined]

    def kombus_transport(module: object) -> None:
        module.consumer_transport = lambda settings: None  # type: ignore[attr-defined]

    def celerys_backend(module: object) -> None:
        module.worker_result_backend = lambda url: None  # type: ignore[attr-defined]

    table = {
        "bind": [
            ("cleveragents.client", no_producer_bind),
            ("cleveragents.pipeline.chunk", no_worker_bind),
        ],
        "lookups": [("cleveragents.stores.result_meta", no_lookups)],
        "schema": [("cleveragents.runtime.invoke", no_schema)],
        "deadline": [("cleveragents.runtime.kinds.python", no_deadline)],
        "observe": [("cleveragents.worker.invocation_report", no_observer)],
        "transport": [
            ("cleveragents.broker.celery_settings", kombus_transport),
            ("cleveragents.broker.redis.result_backend", celerys_backend),
        ],
    }
    out: dict[str, list[object]] = {}
    for name in wanted:
        for module, change in table[name]:
            out.setdefault(module, []).append(change)
    return out


def _install(wanted: set[str]) -> None:
    import importlib.abc
    import importlib.util
    import sys
    from typing import Any

    unknown = wanted - set(NAMES)
    if unknown:
        raise SystemExit(f"BENCH_ABLATE: unknown {sorted(unknown)}; known: {', '.join(NAMES)}")
    patches = _patches(wanted)

    class AfterImport(importlib.abc.MetaPathFinder):
        """Finds a patched module as usual, then changes it once it has run."""

        def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
            if name not in patches:
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
            if spec is None or spec.loader is None:
                return spec
            run = spec.loader.exec_module

            def exec_module(module: Any) -> None:
                run(module)
                for change in patches[name]:
                    change(module)  # type: ignore[operator]

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, AfterImport())


_WANTED = {n for n in os.environ.get("BENCH_ABLATE", "").split(",") if n}
if _WANTED:
    _install(_WANTED)
