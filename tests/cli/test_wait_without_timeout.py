"""An endless ``--wait`` that the client ends itself (no worker serves the embedded queue)
is one line of the client's own words, never a crash formatting a missing time-out."""

from __future__ import annotations

from typing import Any

import pytest

from cleveragents.cli.render import CliFailure
from cleveragents.cli.submit_cmd import _wait
from cleveragents.client import NoWorkerRunning


class _Client:
    settings: Any = type("S", (), {"embedded": True})()

    def wait(self, request_id: str, **_: Any) -> Any:
        raise NoWorkerRunning(f"no worker serves the embedded queue for {request_id}")


def test_an_endless_wait_ended_by_the_client_says_why_in_one_line() -> None:
    with pytest.raises(CliFailure) as failed:
        _wait(_Client(), "r-1", None)  # type: ignore[arg-type]
    assert failed.value.message == "no worker serves the embedded queue for r-1"
    assert failed.value.exit_code == 1
