"""The layout reads as the architecture: few loose modules, Celery's and kombu's internals
in one place (``broker/``, and the worker app and its tasks that Celery calls)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import Any

import pytest

import cleveragents

PACKAGE = Path(cleveragents.__file__).resolve().parent
#: Where a module may import Celery's or kombu's internals.
INTERNALS_LIVE_IN = ("broker", "worker", "tasks")
#: Modules of Celery and kombu that are their public API.
PUBLIC = {
    "celery",
    "celery.exceptions",
    "celery.result",
    "celery.signals",
    "celery.states",
    "kombu",
    "kombu.exceptions",
    "kombu.utils.url",
}


def _imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def test_the_package_keeps_at_most_eight_loose_modules() -> None:
    loose = sorted(
        p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")
    )
    assert len(loose) <= 8, loose


def test_only_the_broker_and_the_worker_import_celery_or_kombu_internals() -> None:
    outside = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] in INTERNALS_LIVE_IN:
            continue
        for module in _imported_modules(path):
            if module.split(".")[0] in ("celery", "kombu") and module not in PUBLIC:
                outside.append(f"{relative}: {module}")
    assert outside == []


def test_the_layout_check_sees_an_internal_import(tmp_path: Path) -> None:
    # The check above would pass on nothing: it finds what it is there to find.
    sample = tmp_path / "sample.py"
    sample.write_text("from kombu.transport import redis\nfrom celery import Celery\n")
    found = {m for m in _imported_modules(sample) if m not in PUBLIC}
    assert found == {"kombu.transport"}


def test_the_checkouts_celeryconfig_gives_the_packages_configuration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from celery import Celery

    monkeypatch.setenv("CLEVERAGENTS_BROKER_URL", "redis://127.0.0.1:6379/0")
    apps = []
    for module in ("celeryconfig", "cleveragents.worker.celeryconfig"):
        importlib.import_module(module).from_env.cache_clear()
        app = Celery("layout-test", set_as_current=False)
        app.config_from_object(module)
        apps.append(app)
    checkout, package = apps
    try:
        _same_configuration(checkout, package)
    finally:  # read with this test's environment: not for the next test of this process
        importlib.import_module("celeryconfig").from_env.cache_clear()


def _same_configuration(checkout: Any, package: Any) -> None:
    assert checkout.conf.worker_consumer == "cleveragents.worker.consumer:SkillConsumer"
    for name in ("worker_consumer", "broker_url", "task_serializer", "accept_content"):
        assert checkout.conf[name] == package.conf[name]
