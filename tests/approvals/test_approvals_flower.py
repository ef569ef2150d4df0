"""Flower shows a parked invocation as waiting for approval, then as done once approved."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from cleveragents.client import SkillClient
from tests.support.procs import Worker, wait_until
from tests.worker.test_flower import _get, flower  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(180)


def test_flower_shows_an_invocation_waiting_for_approval(
    flower: str,  # noqa: F811
    client: SkillClient,
    redis_url: str,
    start_worker: Callable[..., Worker],
    tmp_path: Path,
) -> None:
    start_worker(redis_url)
    handle = client.submit(
        "test/approvals", "test/send-payment", {"log": str(tmp_path / "p.jsonl"), "key": "k"},
        allow_writes=True,
    )  # fmt: skip

    def row() -> dict[str, str]:
        return dict((_get(f"{flower}/api/tasks") or {}).get(handle.request_id) or {})

    wait_until(lambda: row().get("state") == "AWAITING_APPROVAL", 30, "flower to show it waits")
    assert f"cleveragents approvals approve {handle.request_id}" in str(row().get("result"))
    client.approve(handle.request_id)
    assert handle.result(timeout=60).success
    wait_until(lambda: row().get("state") == "SUCCESS", 30, "flower to show it done")
